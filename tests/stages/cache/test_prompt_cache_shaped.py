"""Same output with and without the prompt cache, per cache kind, on shape-true 4-bit models.

Through the gateway as the engine wires it, two turns of a conversation:
the second resends the first's prompt and answer, and the answer comes back
tokenized differently (as a chat template re-renders it), so only the
first turn's prompt is a prefix of the second. A plain KVCache is cut back
to it; a model with recurrent or sliding-window layers resumes from the
state kept at the first prompt's end (the turn boundary). Greedy and
seeded, the second turn's tokens from the cache equal those from scratch.
The weights are in the form the engine serves them in on this backend
(`plan_memory`: float32 on the CPU, where MLX's quantized kernels are
slow; as stored on Metal), as a server would hold them.
"""

from __future__ import annotations

import pytest

from pipeline.settings import Settings
from stages.cache.prompt import PromptCache
from stages.engine.decisions import plan_memory
from stages.models.loading import ModelInfo, resolve_model
from stages.models.mlx_internals import cache_kind
from tests.stages.cache.test_prompt_cache_gateway import GREEDY, SEEDED, Harness, row

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODELS = {"plain": "qwen3-0.6b-2l", "rotating": "gemma3-1b-6l", "recurrent": "qwen3.5-0.8b-4l"}
SYSTEM = tuple(range(40, 64))
ANSWER_TOKENS = 5


@pytest.fixture
def anyio_backend() -> str:
    # The model is what varies here; one event loop is enough (the gateway's own tests run both).
    return "asyncio"


@pytest.fixture(scope="module", params=sorted(MODELS), ids=sorted(MODELS))
def shaped(request: pytest.FixtureRequest) -> tuple[str, ModelInfo]:
    info = resolve_model(f"shaped:{MODELS[request.param]}")
    served, _, _ = plan_memory(Settings(), info, adapter_bytes=0, cluster=None)
    return request.param, served


def test_the_model_has_the_cache_kind_it_is_named_for(shaped: tuple[str, ModelInfo]) -> None:
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    kind, info = shaped
    model = mlx_lm.load(str(info.path))[0]
    assert cache_kind(make_prompt_cache(model)) == kind


async def test_the_second_turn_is_the_same_with_the_cache(shaped: tuple[str, ModelInfo]) -> None:
    kind, info = shaped
    for sampling in (GREEDY, SEEDED):
        warm = Harness(info, PromptCache(max_bytes=1 << 28), timeout=1500)
        turn1 = SYSTEM + (300, 301, 302)
        first = await warm.run([row("t1", turn1, max_tokens=ANSWER_TOKENS, sampling=sampling)])
        # The answer re-rendered: other tokens than the ones generated.
        rerendered = tuple(900 + t % 50 for t in first.tokens("t1"))
        turn2 = turn1 + rerendered + (310, 311, 312)
        hit = await warm.run([row("t2", turn2, max_tokens=ANSWER_TOKENS, sampling=sampling)])
        cold = await Harness(info, None, timeout=1500).run(
            [row("t2", turn2, max_tokens=ANSWER_TOKENS, sampling=sampling)]
        )
        # Cut back to the whole first prompt (a sliding window inside its 512
        # tokens can still be cut), or resumed from the recurrent state kept
        # at its end (all but its last token). Past the window: unit tests.
        assert hit.cached("t2") == (len(turn1) - 1 if kind == "recurrent" else len(turn1))
        assert hit.tokens("t2") == cold.tokens("t2") and len(cold.tokens("t2")) == ANSWER_TOKENS
