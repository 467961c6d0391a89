"""Idle rows (a Batch API's lines) yield to live ones: preempted first, and preempted to admit a live row.

The account's order is checked on its own, then through the real gateway on the tiny demo model: three
rows whose KV outgrows the budget as they decode, the live one arriving last, so that arrival order alone
would preempt it.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import attrs
import pytest

from pipeline.channels import Channel, open_channel
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import BLOCK, read_model_shape
from stages.messages import Abort, Prepared, StepOutputs
from stages.models.loading import ModelInfo, resolve_model
from tests.stages.cache.test_prompt_cache_gateway import TOKEN_BYTES, Harness, Run
from tests.stages.kv.test_kv_plan import shape
from tests.stages.kv.test_kv_preemption import PRESSED, SAMPLINGS, wave

BLOCK_BYTES = shape().kv_bytes(BLOCK)


def account(budget_blocks: int, *rows: tuple[int, int, bool]) -> KvScheduler:
    """An account holding `rows` of (uid, tokens, idle), admitted in that order."""
    kv = KvScheduler(shape(), budget_bytes=budget_blocks * BLOCK_BYTES)
    for uid, tokens, idle in rows:
        kv.admit(uid, tokens, kv.arrive(), idle=idle)
    return kv


def test_pressure_preempts_idle_rows_before_a_live_row_that_arrived_after_them() -> None:
    # Three rows at a block each need two blocks each for their next token: 6 blocks, over a budget of 4.
    kv = account(4, (1, BLOCK, True), (2, BLOCK, True), (3, BLOCK, False))
    assert kv.victims() == [2]
    kv = account(2, (1, BLOCK, True), (2, BLOCK, True), (3, BLOCK, False))
    assert kv.victims() == [2, 1]


def test_idle_rows_go_latest_first_then_live_rows_latest_first() -> None:
    kv = account(2, (1, BLOCK, False), (2, BLOCK, True), (3, BLOCK, False), (4, BLOCK, True))
    assert kv.victims() == [4, 2, 3]


def test_without_idle_rows_the_latest_arrival_is_preempted_as_before() -> None:
    kv = account(4, (1, BLOCK, False), (2, BLOCK, False), (3, BLOCK, False))
    assert kv.victims() == [3]


def test_a_waiting_live_row_has_idle_rows_preempted_for_its_room() -> None:
    # Two idle rows and a live one at a block: admitting a fourth needs 4 x 2 blocks.
    kv = account(7, (1, BLOCK, True), (2, BLOCK, False), (3, BLOCK, True))
    assert not kv.can_admit(BLOCK)
    assert kv.room_for(BLOCK) == [3]
    kv.release(3)
    assert kv.can_admit(BLOCK)


def test_room_is_not_made_when_it_is_not_needed_or_idle_rows_cannot_make_it() -> None:
    assert account(8, (1, BLOCK, True), (2, BLOCK, False)).room_for(BLOCK) == []
    # The live rows alone leave no room: preempting the idle row would not admit it, so it stays.
    assert account(6, (1, BLOCK, False), (2, BLOCK, False), (3, BLOCK, True)).room_for(3 * BLOCK) == []


def test_a_live_row_may_take_the_whole_batch_from_idle_rows() -> None:
    # Alone it runs whatever it asks (preparation refused rows that cannot fit alone).
    kv = account(4, (1, BLOCK, True), (2, BLOCK, True))
    assert kv.room_for(4 * BLOCK) == [2, 1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def model_info(tiny_model: Path) -> ModelInfo:
    return resolve_model(str(tiny_model))


def idle(row: Prepared) -> Prepared:
    return attrs.evolve(row, params=attrs.evolve(row.params, idle=True))


async def run_late(harness: Harness, early: list[Prepared], late: Prepared, after: int) -> tuple[Run, int]:
    """Run `early` at once and send `late` once `after` steps came back; the run, and the step `late` was sent at."""
    assert harness.scheduler is not None
    inbox: Channel[Prepared] = open_channel(16, name="gateway")
    control: Channel[Abort] = open_channel(harness.max_batch, name="control")
    steps: Channel[StepOutputs] = open_channel(64, name="steps")
    gateway = harness.gateway(inbox, control, steps)
    run, left = Run(), {row.request_id for row in [*early, late]}
    with anyio.fail_after(harness.timeout), steps.receive:
        async with anyio.create_task_group() as group:
            await group.start(gateway.run)
            for row in early:
                inbox.send.send_nowait(row)
            while left:
                run.steps.append(await steps.receive.receive())
                if len(run.steps) == after:
                    inbox.send.send_nowait(late)
                left -= {delta.request_id for delta in run.steps[-1].deltas if delta.finish is not None}
            inbox.send.close()
    return run, after


def stepped(run: Run, request_id: str) -> list[int]:
    """The steps that gave `request_id` a token."""
    return [i for i, step in enumerate(run.steps) if any(d.request_id == request_id for d in step.deltas)]


@pytest.mark.slow
async def test_under_pressure_the_gateway_preempts_idle_rows_and_never_the_live_one_that_came_after(
    model_info: ModelInfo,
) -> None:
    first, second, live = wave(SAMPLINGS["greedy"])
    harness = Harness(model_info, None, budget=PRESSED)
    harness.scheduler = KvScheduler(read_model_shape(model_info.path, model_info.context_window), PRESSED)
    run, _ = await run_late(harness, [idle(first), idle(second)], live, after=4)
    assert harness.scheduler.preemptions > 0
    # The live row gave a token at every step from its first to its last: it never left the batch.
    given = stepped(run, live.request_id)
    assert given == list(range(given[0], given[-1] + 1)) and len(given) == live.max_tokens
    # An idle row did leave it: a gap in its steps.
    assert any(
        len(stepped(run, r.request_id)) < run.finished_at(r.request_id) - stepped(run, r.request_id)[0] + 1
        for r in (first, second)
    )


@pytest.mark.slow
async def test_a_live_row_that_does_not_fit_beside_idle_rows_starts_at_once(model_info: ModelInfo) -> None:
    # Two rows' room to grow a block: the live row fits only with an idle row preempted.
    budget = 2 * 512 * TOKEN_BYTES
    first, second, live = wave(SAMPLINGS["greedy"])
    harness = Harness(model_info, None, budget=budget)
    harness.scheduler = KvScheduler(read_model_shape(model_info.path, model_info.context_window), budget)
    run, sent = await run_late(harness, [idle(first), idle(second)], attrs.evolve(live, max_tokens=20), after=4)
    assert harness.scheduler.preemptions > 0
    # Without idle rows to yield, it would wait for one of them to finish its 600 tokens.
    assert run.admitted_at(live.request_id) < sent + 20
    assert run.finished_at(live.request_id) < min(run.finished_at(r.request_id) for r in (first, second))
