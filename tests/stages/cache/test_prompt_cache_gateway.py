"""The gateway with the prompt cache and the KV scheduler, on the tiny demo model.

The gateway is driven through its own channels, as the engine wires it:
`Prepared` rows in, `StepOutputs` out. The invariants: a row that starts
from cached KV produces exactly the tokens it would have produced from
scratch (greedy, and seeded sampling), rows in one batch may start from
different entries, a row whose KV does not fit waits for the budget, and a
row preempted under memory pressure resumes with the tokens it would have
produced without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from pipeline.channels import Channel, open_channel
from pipeline.requests import GenerationParams, Sampling, TextRequest
from pipeline.tracing import Timeline
from stages.cache.disk import SpillJob
from stages.cache.prompt import PromptCache
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import read_model_shape
from stages.messages import Abort, Prepared, Reply, StepOutputs, send_abort
from stages.model_thread.gateway import GatewayStatistics, GenerationGateway
from stages.models.loading import ModelInfo, load_weights, resolve_model

EOS = frozenset({0, 2})
# The tiny model's KV: 2 layers x 2 heads x 16 dims x (keys, values) x float32.
TOKEN_BYTES = 512
GREEDY = Sampling(temperature=0.0)
SEEDED = Sampling(temperature=1.0, seed=7)
# Ids that never end a row: the tiny model's EOS logits are zero, greedy does not pick them.
SYSTEM = tuple(range(10, 310))


@pytest.fixture(scope="module")
def model_info(tiny_model: Path) -> ModelInfo:
    return resolve_model(str(tiny_model))


def row(request_id: str, prompt: Sequence[int], max_tokens: int = 12, sampling: Sampling = GREEDY) -> Prepared:
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling)
    return Prepared(
        request_id=request_id,
        request=TextRequest(prompt=tuple(prompt), params=params),
        prompt_tokens=tuple(prompt),
        max_tokens=max_tokens,
        params=params,
        reply=Reply(request_id),
        timeline=Timeline.start(),
    )


@attrs.define
class Run:
    """What the gateway said, step by step."""

    steps: list[StepOutputs] = attrs.Factory(list)

    def tokens(self, request_id: str) -> list[int]:
        return [t for step in self.steps for d in step.deltas if d.request_id == request_id for t in d.new_token_ids]

    def cached(self, request_id: str) -> int:
        return next(a.cached_tokens for s in self.steps for a in s.admitted if a.prepared.request_id == request_id)

    def admitted_at(self, request_id: str) -> int:
        return next(i for i, s in enumerate(self.steps) for a in s.admitted if a.prepared.request_id == request_id)

    def finished_at(self, request_id: str) -> int:
        return next(i for i, s in enumerate(self.steps) for d in s.deltas if d.request_id == request_id and d.finish)


@attrs.define
class Harness:
    model_info: ModelInfo
    cache: PromptCache | None
    budget: int = 1 << 30
    max_batch: int = 4
    gateway_statistics: GatewayStatistics | None = None
    scheduler: KvScheduler | None = None
    # Seconds for the whole run; the shape-true models are slow on a busy CPU.
    timeout: float = 60.0
    # Builds the batch's speculation from the loaded model (stages/engine/speculation.py's factory); None: none.
    speculation: Callable[[Any], Any] | None = None

    async def run(self, *waves: Sequence[Prepared], abort_after: dict[str, int] | None = None) -> Run:
        """Send each wave at once and wait for all of its rows to finish before the next."""
        inbox: Channel[Prepared] = open_channel(16, name="gateway")
        control: Channel[Abort] = open_channel(self.max_batch, name="control")
        steps: Channel[StepOutputs] = open_channel(64, name="steps")
        gateway = self.gateway(inbox, control, steps)
        run = Run()
        with anyio.fail_after(self.timeout), steps.receive:
            async with anyio.create_task_group() as group:
                await group.start(gateway.run)
                for wave in waves:
                    # Without a checkpoint between them: the gateway takes the whole wave in one exchange.
                    for item in wave:
                        inbox.send.send_nowait(item)
                    await _until_done(steps, run, {r.request_id for r in wave}, control, abort_after or {})
                inbox.send.close()
        self.gateway_statistics = gateway.statistics()
        return run

    def gateway(
        self, inbox: Channel[Prepared], control: Channel[Abort], steps: Channel[StepOutputs]
    ) -> GenerationGateway:
        """The gateway every run here drives: this harness's model, scheduler, cache and speculation."""
        spills: Channel[SpillJob] = open_channel(4, name="spills")
        return GenerationGateway(
            inbox=inbox.receive,
            control=control.receive,
            aborts=control.send,
            out=steps.send,
            spills_out=spills.send,
            spills_in=spills.receive,
            load=partial(load_weights, self.model_info),
            eos_ids=EOS,
            max_batch=self.max_batch,
            prefill_step_size=64,
            scheduler=self._scheduler(),
            cache=self.cache,
            speculation=self.speculation,
        )

    def _scheduler(self) -> KvScheduler:
        if self.scheduler is None:
            shape = read_model_shape(self.model_info.path, self.model_info.context_window)
            self.scheduler = KvScheduler(shape, self.budget)
        return self.scheduler


async def _until_done(
    steps: Channel[StepOutputs], run: Run, waiting: set[str], control: Channel[Abort], abort_after: dict[str, int]
) -> None:
    counts = dict.fromkeys(waiting, 0)
    while waiting:
        outputs = await steps.receive.receive()
        run.steps.append(outputs)
        for delta in outputs.deltas:
            counts[delta.request_id] = counts.get(delta.request_id, 0) + 1
            if delta.finish is not None or counts[delta.request_id] == abort_after.get(delta.request_id):
                if delta.finish is None:
                    send_abort(control.send, delta.request_id)
                waiting.discard(delta.request_id)


def cache() -> PromptCache:
    return PromptCache(max_bytes=1 << 24)


async def test_a_hit_gives_the_tokens_a_miss_gives(model_info: ModelInfo) -> None:
    """Greedy and seeded sampling alike: turn 2 from cached KV equals turn 2 from scratch."""
    for sampling in (GREEDY, SEEDED):
        warm = Harness(model_info, cache())
        first = await warm.run([row("t1", SYSTEM + (400, 401), sampling=sampling)])
        turn2 = SYSTEM + (400, 401) + tuple(first.tokens("t1")) + (402, 403, 404)
        hit = await warm.run([row("t2", turn2, sampling=sampling)])
        cold = await Harness(model_info, None).run([row("t2", turn2, sampling=sampling)])
        assert hit.cached("t2") == len(SYSTEM) + 2 + 12
        assert cold.cached("t2") == 0
        assert hit.tokens("t2") == cold.tokens("t2") and len(cold.tokens("t2")) == 12


async def test_rows_in_one_batch_start_from_different_prefixes(model_info: ModelInfo) -> None:
    harness = Harness(model_info, cache())
    a, b = SYSTEM + (500,), tuple(range(600, 900)) + (501,)
    await harness.run([row("a", a)], [row("b", b)])
    wave = [row("a2", a + (7,) * 5), row("b2", b[:150] + (8,) * 5), row("cold", tuple(range(320, 360)))]
    hit = await harness.run(wave)
    cold = await Harness(model_info, None).run(wave)
    assert [hit.cached(r.request_id) for r in wave] == [len(a), 150, 0]
    assert len({hit.admitted_at(r.request_id) for r in wave}) == 1  # admitted together
    assert all(hit.tokens(r.request_id) == cold.tokens(r.request_id) for r in wave)


async def test_an_aborted_row_leaves_its_kv_for_the_next_request(model_info: ModelInfo) -> None:
    """A stop string (or a client retrying) ends a row early; what it computed is still a valid prefix."""
    harness = Harness(model_info, cache())
    await harness.run([row("stopped", SYSTEM, max_tokens=50)], abort_after={"stopped": 3})
    retry = await harness.run([row("retry", SYSTEM + (900,))])
    assert retry.cached("retry") == len(SYSTEM)


async def test_a_row_waits_until_its_kv_fits_beside_the_others(model_info: ModelInfo) -> None:
    """Two rows of 312 tokens each; the budget holds one (with a block to grow): the second waits for the first."""
    budget = 768 * TOKEN_BYTES
    harness = Harness(model_info, None, budget=budget)
    first, second = row("first", SYSTEM), row("second", tuple(range(700, 1000)))
    run = await harness.run([first, second])
    assert run.admitted_at("second") > run.finished_at("first")
    assert run.tokens("second") and run.tokens("first")


async def test_rows_that_fit_together_share_the_batch(model_info: ModelInfo) -> None:
    # Each row holds 2 blocks and may grow into a third.
    harness = Harness(model_info, None, budget=2 * 768 * TOKEN_BYTES)
    run = await harness.run([row("first", SYSTEM), row("second", tuple(range(700, 1000)))])
    assert run.admitted_at("second") == run.admitted_at("first")


async def test_the_cache_counts_the_memory_it_holds(model_info: ModelInfo) -> None:
    """Entries cut from a padded batch of three, from an abort and from a hit hold their own
    arrays, not views of the batch's: every array the cache reaches is counted, and dropping
    the cache frees what it reports. A view would keep a whole batch buffer alive (here
    3 rows x 512 positions x 128 bytes, 196 KiB per array, 24 arrays); MLX's allocator
    itself was seen to free up to 16 KiB more than the arrays' sizes."""
    import gc

    import mlx.core as mx

    held = cache()
    harness = Harness(model_info, held)
    wave = [
        row("short", tuple(range(20, 50))),
        row("long", SYSTEM, max_tokens=30),
        row("cut", tuple(range(700, 900)), max_tokens=40),
    ]
    first = await harness.run(wave, abort_after={"cut": 5})
    # The sink hears of the removal: no further delta would tell it.
    assert [step.removed for step in first.steps if step.removed] == [("cut",)]
    await harness.run([row("again", SYSTEM + (901, 902))])
    stats = harness.gateway_statistics
    assert stats is not None and (stats.active, stats.waiting_for_memory, stats.kv_held_bytes) == (0, 0, 0)
    counted = held.statistics()
    assert counted.entries == 3  # "again" replaced "long"
    assert sum(array.nbytes for array in _arrays_reached_from(held)) == counted.kv_bytes
    gc.collect()
    before = mx.get_active_memory()
    del held, harness
    gc.collect()
    assert 0 <= before - mx.get_active_memory() - counted.kv_bytes < 32 << 10


def _arrays_reached_from(root: object) -> list[Any]:
    import gc

    import mlx.core as mx

    seen, todo, found = set(), [root], []
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, type):
            continue
        seen.add(id(item))
        if isinstance(item, mx.array):
            found.append(item)
        else:
            todo += gc.get_referents(item) + ([vars(item)] if hasattr(item, "__dict__") else [])
    return found


def test_the_budgets_here_are_counted_in_the_tiny_models_token_bytes(model_info: ModelInfo) -> None:
    assert read_model_shape(model_info.path, model_info.context_window).kv_bytes_per_token == TOKEN_BYTES
