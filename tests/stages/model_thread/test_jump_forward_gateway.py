"""Jump-forward through the real gateway on the tiny demo model, built as the engine builds it
(stages/engine/speculation.py's factory from the settings): a row that starts from the prompt cache, and rows
preempted under memory pressure and resumed, give the tokens they give with `MLX_RELAY_JUMP_FORWARD=0`, in
fewer steps; `/stats`' figure counts the forced tokens taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest

from pipeline.requests import Constraint, ConstraintKind, Sampling
from pipeline.settings import Settings
from stages.cache.prompt import PromptCache
from stages.engine.speculation import speculation_factory
from stages.messages import CompiledConstraint, Prepared
from stages.models.loading import ModelInfo, load_tokenizer
from stages.prompt.constraints import ConstraintCompiler
from tests.stages.cache.test_prompt_cache_gateway import GREEDY, SYSTEM, Harness, Run, row
from tests.stages.kv.test_kv_preemption import PRESSED

# Long replies whose every item has forced keys and punctuation: rows live long enough to be preempted.
ITEMS: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"enum": [1, 2, 3]},
            "kind": {"const": "thing"},
            "note": {"type": "string", "maxLength": 6},
        },
        "required": ["id", "kind", "note"],
        "additionalProperties": False,
    },
    "minItems": 80,
}
# EOS held off where the grammar would allow it, so seeded rows live as long as greedy ones.
SEEDED = Sampling(temperature=0.8, top_p=0.95, seed=11, logit_bias={0: -100.0, 2: -100.0})


@pytest.fixture
def anyio_backend() -> str:
    # The gateway's thread is backend-neutral code already tested on both; this is about the model's tokens.
    return "asyncio"


@pytest.fixture(scope="module")
def items(model_info: ModelInfo) -> CompiledConstraint:
    tokenizer = load_tokenizer(model_info)
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()))  # type: ignore[attr-defined]
    return compiler.compile(Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=ITEMS, param="response_format"))


def speculation(model_info: ModelInfo, *, jump: bool) -> Callable[[Any], Any] | None:
    # Prompt lookup (on by default) off: the steps jump-forward saves, alone.
    settings = Settings(jump_forward=jump, prompt_lookup=False)
    return speculation_factory(settings, load_tokenizer(model_info), sharded=False, adapters=False)


def constrained(request_id: str, prompt: Sequence[int], grammar: CompiledConstraint, **extra: Any) -> Prepared:
    return attrs.evolve(row(request_id, prompt, **extra), constraint=grammar)


def steps(run: Run, request_id: str) -> int:
    """Steps in which the row got a token."""
    return sum(1 for step in run.steps if any(delta.request_id == request_id for delta in step.deltas))


def test_without_jump_forward_the_engine_builds_no_speculation(model_info: ModelInfo) -> None:
    assert speculation(model_info, jump=False) is None
    # Never refused: where the batch cannot verify (sharded, adapters), forced tokens are decoded a step each.
    tokenizer = load_tokenizer(model_info)
    alone = Settings(prompt_lookup=False)
    assert speculation_factory(alone, tokenizer, sharded=True, adapters=False) is None
    assert speculation_factory(alone, tokenizer, sharded=False, adapters=True) is None


async def test_a_row_from_the_prompt_cache(model_info: ModelInfo, items: CompiledConstraint) -> None:
    """The second turn starts from the first's cached KV: the same tokens as without jump-forward, fewer steps."""
    runs: dict[bool, tuple[Run, Run]] = {}
    for jump in (False, True):
        harness = Harness(model_info, PromptCache(max_bytes=1 << 24), speculation=speculation(model_info, jump=jump))
        first = await harness.run([constrained("t1", SYSTEM, items, max_tokens=40)])
        turn2 = SYSTEM + tuple(first.tokens("t1")) + (402, 403)
        second = await harness.run([constrained("t2", turn2, items, max_tokens=60), row("free", SYSTEM[:50])])
        assert second.cached("t2") >= len(SYSTEM) + 39
        runs[jump] = first, second
        statistics = harness.gateway_statistics
        assert statistics is not None
        forced = statistics.jump_forward
        assert (forced is not None and forced.accepted_tokens > 0) if jump else forced is None
    (plain_first, plain_second), (jumped_first, jumped_second) = runs[False], runs[True]
    assert jumped_first.tokens("t1") == plain_first.tokens("t1")
    assert jumped_second.tokens("t2") == plain_second.tokens("t2")
    assert jumped_second.tokens("free") == plain_second.tokens("free")
    assert steps(jumped_second, "t2") < steps(plain_second, "t2")


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_preempted_rows_resume_with_the_same_tokens(
    model_info: ModelInfo, items: CompiledConstraint, sampling: Sampling
) -> None:
    prompts = [tuple(range(10 + 50 * i, 50 + 50 * i)) for i in range(3)]
    wave = [constrained(f"r{i}", prompt, items, max_tokens=600, sampling=sampling) for i, prompt in enumerate(prompts)]
    ample = await Harness(model_info, None, speculation=speculation(model_info, jump=False)).run(wave)
    pressed = Harness(
        model_info, PromptCache(max_bytes=1 << 26), budget=PRESSED, speculation=speculation(model_info, jump=True)
    )
    run = await pressed.run(wave)
    scheduler = pressed.scheduler
    assert scheduler is not None and scheduler.preemptions > 0 and scheduler.resumed == scheduler.preemptions
    for prepared in wave:
        assert run.tokens(prepared.request_id) == ample.tokens(prepared.request_id), prepared.request_id
        assert steps(run, prepared.request_id) < steps(ample, prepared.request_id)
