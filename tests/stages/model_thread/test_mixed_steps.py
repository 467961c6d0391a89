"""stages/model_thread/mixed_steps.py and stages/models/mixed_pass.py: one pass a step changes how fast, never what.

Each case runs the same rows through mlx-lm's `BatchGenerator` and through one whose steps that prefill beside
decoding rows run as one pass: every row's tokens, logprobs, finish and final cache must agree, with rows joining
mid-generation, greedy, seeded and with penalties, under speculation, and on a model with sliding-window layers
past its window. Each case also checks that steps were mixed, so a wrapper that never mixed cannot pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from pipeline.requests import Sampling
from stages.model_thread.drafters import CostGate, PromptLookup, RowPolicy
from stages.model_thread.mixed_steps import MixedSteps, mixing
from stages.model_thread.speculative_batch import Speculation, speculating
from stages.models.loading import ModelInfo, load_weights
from stages.models.mixed_pass import ALL, FAMILIES, LAST, NONE, Segment, mixable, mixed_forward
from stages.models.mlx_internals import PLAIN, RECURRENT, ROTATING, cache_kind
from tests.stages.model_thread.drive import (
    COPY,
    GREEDY,
    OTHER,
    PENALISED,
    SEEDED,
    Oracle,
    drive,
    real_text_rows,
    same_replies,
)
from tests.stages.model_thread.windowed import windowed_model


@pytest.fixture(scope="module")
def model(model_info: ModelInfo) -> Any:
    return load_weights(model_info)


@pytest.fixture(scope="module")
def windowed() -> Any:
    return windowed_model()


def _batch(model: Any, step: int = 16) -> BatchGenerator:
    return BatchGenerator(
        model, stop_tokens=[[0]], completion_batch_size=4, prefill_batch_size=4, prefill_step_size=step
    )


def _mixed(make: Any, model: Any) -> tuple[Any, MixedSteps]:
    generator = mixing(make, model, cache_kind(make_prompt_cache(model)))()
    assert isinstance(generator._next, MixedSteps)
    return generator, generator._next


def _same(expected: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]]) -> None:
    same_replies(expected, got)
    for name, want in expected.items():
        for mine, theirs in zip(got[name]["cache"], want["cache"]):
            assert mine.offset == theirs.offset, name
            keys, expected_keys = mine.state[0], theirs.state[0]
            assert keys.shape == expected_keys.shape, name
            assert mx.allclose(keys, expected_keys, atol=1e-4).item(), name


# Rows join while others decode; prompts of different lengths end in different steps.
JOINING = {
    0: [("a", COPY, GREEDY, 40, [[0]])],
    3: [("b", OTHER, GREEDY, 30, [[0]])],
    4: [("c", COPY[5:], GREEDY, 25, [[0]])],
    9: [("d", OTHER[:20] + OTHER[:20], GREEDY, 20, [[0]])],
}


def _with(sampling: Sampling) -> dict[int, list[Any]]:
    return {call: [(n, p, sampling, m, s) for n, p, _, m, s in rows] for call, rows in JOINING.items()}


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalties"])
def test_rows_joining_mid_generation_keep_their_tokens(model: Any, sampling: Sampling) -> None:
    arrivals = _with(sampling)
    generator, steps = _mixed(lambda: _batch(model), model)
    _same(drive(_batch(model), arrivals), drive(generator, arrivals))
    assert steps.counts.steps >= 3


def test_two_prompts_arriving_together_are_right_padded_by_mlx_lm(model: Any) -> None:
    """Chunks of different lengths in one step: mlx-lm's own step pads them; the rows keep their tokens."""
    arrivals = {
        0: [("a", COPY, GREEDY, 30, [[0]])],
        2: [("b", OTHER[:21], GREEDY, 20, [[0]]), ("c", COPY[:37], GREEDY, 20, [[0]])],
    }
    generator, steps = _mixed(lambda: _batch(model), model)
    _same(drive(_batch(model), arrivals), drive(generator, arrivals))
    assert steps.counts.steps >= 1


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_verifying_pass_mixes_with_a_prompt(model: Any, sampling: Sampling) -> None:
    """Prompt lookup's verifying pass ([R, 1 + K]) is the generation batch's segment of the mixed pass."""
    policy = RowPolicy(max_k=4, min_acceptance=0.0, max_rows=8)
    speculation = Speculation(drafter=PromptLookup(), policy=policy, gate=CostGate(measured=False))
    make = speculating(lambda: _batch(model), speculation)
    arrivals = _with(sampling)
    generator, steps = _mixed(make, model)
    _same(drive(_batch(model), arrivals), drive(generator, arrivals))
    assert steps.counts.steps >= 3 and speculation.counts.proposed > 0


def test_sliding_window_layers_past_their_window_keep_their_tokens(windowed: Any) -> None:
    assert cache_kind(make_prompt_cache(windowed)) == ROTATING
    arrivals = {
        0: [("a", COPY, GREEDY, 30, [[0]])],
        5: [("b", OTHER, GREEDY, 20, [[0]])],
        8: [("c", OTHER[:6], GREEDY, 12, [[0]])],
    }
    generator, steps = _mixed(lambda: _batch(windowed, step=6), windowed)
    _same(drive(_batch(windowed, step=6), arrivals), drive(generator, arrivals))
    assert steps.counts.steps >= 3


def test_verifying_passes_over_sliding_window_layers_mix_with_prompts(windowed: Any) -> None:
    """Speculation's verifying passes over rotating layers, cut back after each, in mixed steps past the window."""
    arrivals = {
        0: [("a", COPY, GREEDY, 30, [[0]])],
        5: [("b", OTHER, GREEDY, 20, [[0]])],
        8: [("c", OTHER[:6], GREEDY, 12, [[0]])],
    }
    expected = drive(_batch(windowed, step=6), arrivals)
    oracle = Oracle([row["prompt"] + row["tokens"] for row in expected.values()])
    policy = RowPolicy(max_k=4, min_acceptance=0.0, max_rows=8)
    speculation = Speculation(drafter=oracle, policy=policy, gate=CostGate(measured=False))
    generator, steps = _mixed(speculating(lambda: _batch(windowed, step=6), speculation), windowed)
    same_replies(expected, drive(generator, arrivals))
    assert steps.counts.steps >= 3 and 0 < speculation.counts.accepted < speculation.counts.proposed


def _cache(model: Any, rows: int, context: int) -> list[Any]:
    layers = [BatchKVCache([0] * rows) for _ in model.model.layers]
    if context:
        model(mx.array([[(5 * r + t) % 200 + 3 for t in range(context)] for r in range(rows)]), cache=layers)
        mx.eval([layer.state for layer in layers])
    return layers


def test_one_pass_gives_each_segment_what_its_own_pass_gives(model: Any) -> None:
    decoding, verifying = mx.array([[7], [9], [11]]), mx.array([[4, 5, 6], [8, 9, 10]])
    chunk = mx.array([list(range(40, 64))])
    alone = [_cache(model, 3, 12), _cache(model, 2, 20), _cache(model, 1, 0)]
    expected = [model(decoding, cache=alone[0]), model(verifying, cache=alone[1])]
    model(chunk, cache=alone[2])
    mixed = [_cache(model, 3, 12), _cache(model, 2, 20), _cache(model, 1, 0)]
    attentions = [layer["self_attn"] for layer in model.model.layers]
    norm = model.model["norm"]
    got = mixed_forward(
        model, [Segment(decoding, mixed[0], LAST), Segment(verifying, mixed[1], ALL), Segment(chunk, mixed[2], NONE)]
    )
    assert got[0].shape == (3, 1, expected[0].shape[-1]) and got[1].shape == expected[1].shape and got[2] is None
    assert mx.allclose(got[0], expected[0][:, -1:], atol=1e-4).item()
    assert mx.allclose(got[1], expected[1], atol=1e-4).item()
    for theirs, mine in zip(alone, mixed):
        for a, b in zip(theirs, mine):
            assert mx.array_equal(a.offset, b.offset).item()
            assert mx.allclose(a.keys[..., : a._idx, :], b.keys[..., : b._idx, :], atol=1e-4).item()
    # The model is its own again: the pass swapped modules only while it ran.
    assert [layer["self_attn"] for layer in model.model.layers] == attentions and model.model["norm"] is norm


def _family(module: str) -> Any:
    """A random-weight model of one of mlx-lm's families, small: 2 layers, 4 query heads over 2 KV heads."""
    import importlib

    family = importlib.import_module(module)
    shape: dict[str, Any] = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 256,
        "rms_norm_eps": 1e-5,
    }
    extra = {
        "mlx_lm.models.qwen3": {
            "max_position_embeddings": 512,
            "head_dim": 16,
            "tie_word_embeddings": True,
            "rope_theta": 1e6,
        },
        "mlx_lm.models.llama": {"tie_word_embeddings": False},
    }.get(module, {})
    args = family.ModelArgs(model_type=module.rsplit(".", 1)[1], **shape, **extra)
    mx.random.seed(7)
    built = family.Model(args)
    mx.eval(built.parameters())
    return built


@pytest.mark.parametrize("module", sorted(FAMILIES - {"mlx_lm.models.gemma3_text"}))
def test_every_family_that_mixes_gives_each_segment_its_own_pass(module: str) -> None:
    """Each family `mixable` admits, checked as the real and demo models are (Gemma 3 has its own tests above)."""
    built = _family(module)
    assert mixable(built)
    decoding, chunk = mx.array([[7], [9]]), mx.array([list(range(40, 52)), list(range(60, 72))])
    alone, mixed = [_cache(built, 2, 6), _cache(built, 2, 0)], [_cache(built, 2, 6), _cache(built, 2, 0)]
    expected = built(decoding, cache=alone[0])
    after = built(chunk, cache=alone[1])[:, -1:]
    got = mixed_forward(built, [Segment(decoding, mixed[0], LAST), Segment(chunk, mixed[1], LAST)])
    assert mx.allclose(got[0], expected, atol=1e-4).item() and mx.allclose(got[1], after, atol=1e-4).item()


def test_the_model_is_restored_when_the_pass_fails(model: Any) -> None:
    attentions = [layer["self_attn"] for layer in model.model.layers]
    with pytest.raises(ValueError):
        # A cache of the wrong rows for its segment fails inside the pass.
        mixed_forward(model, [Segment(mx.array([[1], [2]]), _cache(model, 3, 4), LAST)])
    assert [layer["self_attn"] for layer in model.model.layers] == attentions


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()


def test_only_models_whose_state_is_per_token_mix(model: Any, windowed: Any) -> None:
    assert mixable(model) and mixable(windowed)
    assert not mixable(_Recurrent())

    def make() -> Any:
        return _batch(model)

    assert mixing(make, model, PLAIN) is not make
    assert mixing(make, model, RECURRENT) is make


def test_the_real_default_model_gives_the_same_replies_mixed(smollm2_model: Path) -> None:
    """SmolLM2 as the server serves it (float32 on a CPU; 9 query heads over 3 KV heads): rows of real text arrive
    while others decode, greedy, and every row's reply and final cache are the same with steps mixed."""
    real, arrivals = real_text_rows(smollm2_model, [GREEDY, GREEDY, GREEDY])
    generator, steps = _mixed(lambda: _batch(real, step=8), real)
    _same(drive(_batch(real, step=8), arrivals), drive(generator, arrivals))
    assert steps.counts.steps >= 3
