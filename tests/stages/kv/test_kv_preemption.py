"""Preemption under memory pressure, on the tiny demo model through the real gateway.

Three rows start together; their KV outgrows the budget as they decode, so
the scheduler preempts the latest arrival (its KV goes to the prompt cache,
it waits at the head of the queue) and resumes it when room returns. The
invariant: every row's tokens equal those of a run with an ample budget,
greedy and seeded, with penalties, from the cache or recomputed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.requests import Sampling
from stages.cache.prompt import PromptCache
from stages.models.loading import ModelInfo, resolve_model
from tests.stages.cache.test_prompt_cache_gateway import TOKEN_BYTES, Harness, Run, row

# Three rows of 40-token prompts, each admitted with room for a block more: 3 x 512 tokens.
PRESSED = 3 * 512 * TOKEN_BYTES
SAMPLINGS = {
    "greedy": Sampling(temperature=0.0),
    # EOS held off, so the rows live long enough to be preempted.
    "seeded": Sampling(temperature=0.8, top_p=0.95, seed=11, logit_bias={0: -100.0, 2: -100.0}),
    "penalized": Sampling(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.3),
}


@pytest.fixture
def anyio_backend() -> str:
    # The gateway's thread is backend-neutral code already tested on both; this is about the model's tokens.
    return "asyncio"


@pytest.fixture(scope="module")
def model_info(tiny_model: Path) -> ModelInfo:
    return resolve_model(str(tiny_model))


def wave(sampling: Sampling) -> list:  # type: ignore[type-arg]
    prompts = [tuple(range(10 + 50 * i, 50 + 50 * i)) for i in range(3)]
    return [row(f"r{i}", prompt, max_tokens=600, sampling=sampling) for i, prompt in enumerate(prompts)]


# The ample-budget runs, shared by the cached and recomputed cases.
_AMPLE: dict[str, Run] = {}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "cached"),
    [("greedy", True), ("greedy", False), ("seeded", True), ("seeded", False), ("penalized", True)],
)
async def test_a_preempted_row_resumes_with_the_tokens_it_would_have_produced(
    model_info: ModelInfo, kind: str, cached: bool
) -> None:
    rows = wave(SAMPLINGS[kind])
    if kind not in _AMPLE:
        _AMPLE[kind] = await Harness(model_info, None).run(rows)
    ample = _AMPLE[kind]
    pressed = Harness(model_info, PromptCache(max_bytes=1 << 26) if cached else None, budget=PRESSED)
    run = await pressed.run(wave(SAMPLINGS[kind]))
    scheduler = pressed.scheduler
    assert scheduler is not None
    assert scheduler.preemptions > 0 and scheduler.resumed == scheduler.preemptions
    # Started together: the budget held all three at their current size.
    assert len({run.admitted_at(r.request_id) for r in rows}) == 1
    for r in rows:
        assert run.tokens(r.request_id) == ample.tokens(r.request_id), r.request_id
    assert scheduler.held_bytes == 0


async def test_rows_without_pressure_are_never_preempted(model_info: ModelInfo) -> None:
    harness = Harness(model_info, None)
    await harness.run(wave(SAMPLINGS["greedy"]))
    assert harness.scheduler is not None and harness.scheduler.preemptions == 0
