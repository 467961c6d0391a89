"""stages/model_thread/step_budget.py by hand, and the gateway under a step budget on the tiny demo model.

The gateway's tests read what it did step by step (its `StepOutputs` and its
step counter), never how long a step took: a 1 ms target makes every chunk
the smallest whatever the machine's speed, so a long prompt must take many
steps.
"""

from __future__ import annotations

from functools import partial

import anyio
import pytest
from mlx_lm.generate import PromptProcessingBatch

from pipeline.channels import Channel, open_channel
from stages.cache.disk import SpillJob
from stages.cache.prompt import PromptCache
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import read_model_shape
from stages.messages import Abort, Prepared, StepOutputs, send_abort
from stages.model_thread.gateway import GenerationGateway
from stages.model_thread.step_budget import StepBudget
from stages.models.loading import ModelInfo, load_weights
from tests.stages.cache.test_prompt_cache_gateway import EOS, TOKEN_BYTES, model_info, row  # noqa: F401

# Ids that never end a row on the tiny model (its EOS logits are zero: greedy never picks them).
LONG_PROMPT = tuple(10 + i % 900 for i in range(1500))


def _prefilling(uid: int, done: int, total: int = 1000) -> PromptProcessingBatch.Response:
    return PromptProcessingBatch.Response(uid, (done, total), False, False)


def test_the_first_chunk_is_small_and_then_sized_from_the_measured_speed() -> None:
    budget = StepBudget(target_s=0.2, max_chunk=4096)
    assert budget.chunk(prefilling=1, decoding=0, other_work=True) == 64
    # 64 tokens in 64 ms: a token costs 1 ms, so 200 fit the target, split between the rows that prefill together.
    budget.record(0.064, [_prefilling(0, 64)], decoding=0)
    assert budget.chunk(prefilling=1, decoding=0, other_work=True) == 200
    assert budget.chunk(prefilling=2, decoding=0, other_work=True) == 100


def test_a_prompt_that_keeps_nobody_waiting_prefills_in_full_chunks() -> None:
    budget = StepBudget(target_s=0.2, max_chunk=512)
    assert budget.chunk(prefilling=1, decoding=0) == 512
    # A token costs 10 ms: beside a decoding row or queued exclusive work the chunk shrinks to the target...
    budget.record(0.5, [_prefilling(0, 50)], decoding=1)
    assert budget.chunk(prefilling=1, decoding=1) < 512
    assert budget.chunk(prefilling=1, decoding=0, other_work=True) == 20
    # ...and alone it stays whole, however slow, and a step past the target for that is not counted as over it.
    assert budget.chunk(prefilling=2, decoding=0) == 512
    budget.record(5.12, [_prefilling(0, 562)], decoding=0)
    assert budget.over_target == 1
    # Beside queued exclusive work the target held, and a step past it counts.
    budget.record(5.12, [_prefilling(0, 1074)], decoding=0, other_work=True)
    assert budget.over_target == 2


def test_decoding_rows_take_their_share_of_the_step_first() -> None:
    budget = StepBudget(target_s=0.2, max_chunk=4096)
    budget.record(0.1, [], decoding=3)
    budget.record(0.164, [_prefilling(0, 64)], decoding=3)
    # The step's decode part (100 ms) leaves 100 ms: 100 tokens at 1 ms each.
    assert budget.chunk(prefilling=1, decoding=3) == 100
    # With nothing decoding the whole target is prefill's.
    assert budget.chunk(prefilling=1, decoding=0, other_work=True) == 200


def test_with_a_ratio_the_step_aims_at_a_multiple_of_the_decode_step() -> None:
    """The decoding rows keep half of each step however long their own step is; the fixed target is the floor."""
    budget = StepBudget(target_s=0.2, max_chunk=4096, decode_ratio=2.0)
    # Decoding alone takes 500 ms, more than the fixed 200 ms: a fixed target would leave the prompt 16 tokens.
    budget.record(0.5, [], decoding=8)
    budget.record(0.564, [_prefilling(0, 64)], decoding=8)
    assert budget.target(decoding=8) == 1.0
    # 1 ms a prompt token: the step's other 500 ms take 500 tokens.
    assert budget.chunk(prefilling=1, decoding=8) == 500
    # The step that fits the target is not over it; nothing decoding, or a short decode step, leaves the floor.
    budget.record(1.0, [_prefilling(0, 564)], decoding=8)
    assert budget.over_target == 0
    assert budget.target(decoding=0) == 0.2
    fast = StepBudget(target_s=0.2, max_chunk=4096, decode_ratio=2.0)
    fast.record(0.02, [], decoding=8)
    assert fast.target(decoding=8) == 0.2
    fixed = StepBudget(target_s=0.2, max_chunk=4096)
    fixed.record(0.5, [], decoding=8)
    assert fixed.target(decoding=8) == 0.2


def test_prompts_that_outnumber_the_streams_take_their_share_by_count() -> None:
    """A burst of new requests beside one stream: each waiting row gets an equal share of the step, not the half the
    ratio leaves one prompt (which cut 14 prompts to 16 tokens each for one stream's sake)."""
    budget = StepBudget(target_s=0.2, max_chunk=4096, decode_ratio=2.0)
    budget.record(0.5, [], decoding=1)
    budget.record(0.564, [_prefilling(0, 64)], decoding=1)
    # 14 prompts and 1 stream: the stream's part is 1/15 of the step; 1 ms a prompt token.
    assert budget.target(decoding=1, prefilling=14) == pytest.approx(7.5)
    assert budget.chunk(prefilling=14, decoding=1) == 500
    # One prompt beside 8 streams keeps the ratio's half, and so does a prompt beside as many streams.
    assert budget.target(decoding=8, prefilling=1) == 1.0
    assert budget.target(decoding=4, prefilling=4) == 1.0
    # A step of that length beside the burst is on target; the same step beside one prompt is over it.
    budget.record(7.5, [_prefilling(0, 564)], decoding=1)
    assert budget.over_target == 0
    budget.chunk(prefilling=1, decoding=1)
    budget.record(7.5, [_prefilling(0, 1064)], decoding=1)
    assert budget.over_target == 1


def test_prompts_that_end_within_two_chunks_end_in_this_step() -> None:
    """A pass over the weights costs what many prompt tokens do: a 25-token prompt is not cut 16 + 8."""
    budget = StepBudget(target_s=0.2, max_chunk=512, min_chunk=16)
    budget.record(0.5, [], decoding=16)
    budget.record(0.51, [_prefilling(0, 10)], decoding=16)
    assert budget.chunk(prefilling=1, decoding=16) == 16
    assert budget.chunk(prefilling=1, decoding=16, longest=24) == 24
    assert budget.chunk(prefilling=1, decoding=16, longest=32) == 32
    # A longer prompt keeps the budget's chunk, and a short one never shrinks it.
    assert budget.chunk(prefilling=1, decoding=16, longest=33) == 16
    assert budget.chunk(prefilling=1, decoding=16, longest=8) == 16
    # Never past the largest chunk.
    roomy = StepBudget(target_s=0.2, max_chunk=512)
    assert roomy.chunk(prefilling=1, decoding=0, longest=1000) == 512


def test_the_chunk_stays_between_its_bounds() -> None:
    budget = StepBudget(target_s=0.2, max_chunk=128, min_chunk=16)
    budget.record(0.064, [_prefilling(0, 64)], decoding=0)
    assert budget.chunk(prefilling=1, decoding=0, other_work=True) == 128
    # Decoding alone fills the target: a prompt still moves, by the smallest chunk.
    budget.record(0.5, [], decoding=16)
    assert budget.chunk(prefilling=1, decoding=16) == 16
    assert budget.over_target == 1


def test_what_a_step_prefilled_is_the_progress_since_the_last_step() -> None:
    """Rows that join, go on, finish and leave: only each one's progress in this step counts."""
    budget = StepBudget(target_s=1.0, max_chunk=4096)
    budget.record(0.1, [_prefilling(0, 100)], decoding=0)
    # Row 0 moves 100 more and row 1 starts with 100: 200 tokens in 0.1 s.
    budget.record(0.1, [_prefilling(0, 200), _prefilling(1, 100)], decoding=0)
    # 1 ms, then 0.5 ms a token, smoothed: 0.85 ms.
    assert budget.chunk(prefilling=1, decoding=1) == int(1.0 / 0.00085)
    # Row 0 leaves, row 1 ends its prompt (the batch's last response for it): nothing prefilled, nothing kept.
    budget.record(0.1, [PromptProcessingBatch.Response(1, (1000, 1000), True, True)], decoding=1)
    assert budget.chunk(prefilling=1, decoding=0, other_work=True) == int(1.0 / 0.00085)
    budget.record(0.1, [_prefilling(5, 50)], decoding=1)
    assert budget._progress == {5: 50}


def _gateway(
    info: ModelInfo,
    steps: Channel[StepOutputs],
    inbox: Channel[Prepared],
    control: Channel[Abort],
    cache: PromptCache | None = None,
    *,
    prefill_step_size: int = 2048,
) -> GenerationGateway:
    spills: Channel[SpillJob] = open_channel(4, name="spills")
    # A 1 ms target: every chunk beside a decoding row is the smallest (16 tokens), where a 2,048-token chunk would
    # take the prompt at once.
    return GenerationGateway(
        inbox=inbox.receive,
        control=control.receive,
        aborts=control.send,
        out=steps.send,
        spills_out=spills.send,
        spills_in=spills.receive,
        load=partial(load_weights, info),
        eos_ids=EOS,
        max_batch=4,
        prefill_step_size=prefill_step_size,
        step_budget_s=0.001,
        cache=cache,
        scheduler=KvScheduler(read_model_shape(info.path, info.context_window), 1 << 30),
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_long_prompt_prefills_over_many_steps_and_a_decoding_row_advances_in_each(
    model_info: ModelInfo,
) -> None:
    inbox: Channel[Prepared] = open_channel(16, name="gateway")
    control: Channel[Abort] = open_channel(4, name="control")
    steps: Channel[StepOutputs] = open_channel(256, name="steps")
    gateway = _gateway(model_info, steps, inbox, control)
    seen: list[StepOutputs] = []
    with anyio.fail_after(90), steps.receive, inbox.send:
        async with anyio.create_task_group() as group:
            await group.start(gateway.run)
            inbox.send.send_nowait(row("decoding", tuple(range(10, 40)), max_tokens=1000))
            while sum(len(s.deltas) for s in seen) < 3:
                seen.append(await steps.receive.receive())
            inbox.send.send_nowait(row("long", LONG_PROMPT, max_tokens=2))
            while not any(d.request_id == "long" and d.finish for s in seen for d in s.deltas):
                seen.append(await steps.receive.receive())
            send_abort(control.send, "decoding")
            inbox.send.close()
    admitted = next(i for i, s in enumerate(seen) for a in s.admitted if a.prepared.request_id == "long")
    first = next(i for i, s in enumerate(seen) for d in s.deltas if d.request_id == "long")
    between = seen[admitted:first]
    # 1,500 prompt tokens by chunks of 16 to 64: many steps, and the decoding row got a token in every one.
    assert len(between) >= 10, len(between)
    assert all(any(d.request_id == "decoding" for d in s.deltas) for s in between)
    assert gateway.statistics().prefill_chunk == 16


async def test_an_abort_during_a_long_prefill_stops_it_at_the_next_step(model_info: ModelInfo) -> None:
    inbox: Channel[Prepared] = open_channel(16, name="gateway")
    control: Channel[Abort] = open_channel(4, name="control")
    steps: Channel[StepOutputs] = open_channel(256, name="steps")
    cache = PromptCache(max_bytes=1 << 24)
    # Alone, the prompt prefills in full chunks: 64 tokens, 24 steps for the whole prompt.
    gateway = _gateway(model_info, steps, inbox, control, cache, prefill_step_size=64)
    with anyio.fail_after(90), steps.receive, inbox.send:
        async with anyio.create_task_group() as group:
            await group.start(gateway.run)
            inbox.send.send_nowait(row("long", LONG_PROMPT, max_tokens=4))
            first = await steps.receive.receive()
            assert [a.prepared.request_id for a in first.admitted] == ["long"]
            # A few chunks in (a step with only a prefill hands nothing over: its counter says it ran).
            while gateway.statistics().steps < 3:
                await anyio.sleep(0.001)
            send_abort(control.send, "long")
            aborted_at = gateway.statistics().steps
            outputs = await steps.receive.receive()
            inbox.send.close()
    assert outputs.removed == ("long",) and not outputs.deltas
    # The abort was taken at the top of the next step: at most the step then running finished after it.
    assert gateway.statistics().steps <= aborted_at + 1
    # What it had prefilled went to the prompt cache: a part of the prompt, not all of it.
    kept = cache.statistics()
    assert kept.entries == 1 and 0 < kept.bytes < len(LONG_PROMPT) * TOKEN_BYTES // 2
