"""stages/models/cpu_exp.py: the CPU's exponentials as fused arithmetic give MLX's answers, where they are meant."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.nn.layers import activations as mlx_activations
from mlx_lm.models import activations
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import make_prompt_cache

from stages.models import cpu_attention, cpu_exp
from stages.models.loading import load_tokenizer, load_weights, resolve_model
from tests.stages.models.attention_shapes import shapes

pytestmark = pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the CPU backend's exponentials")

cpu_attention.install()
mlx_attention = cpu_attention.mlx_attention()


def close(ours: mx.array, theirs: mx.array, tolerance: float, floor: float = 1e-30) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    ours_values, their_values = np.asarray(ours), np.asarray(theirs)
    np.testing.assert_array_equal(np.isnan(ours_values), np.isnan(their_values))
    np.testing.assert_allclose(ours_values, their_values, rtol=tolerance, atol=floor)


def test_exp_of_every_nonpositive_float_is_mlx_s_to_the_last_place() -> None:
    magnitudes = np.concatenate([np.geomspace(1e-8, 100, 20_000), [0.0, 87.99, 88.0, 88.01, 200.0, np.inf]])
    x = mx.array(-magnitudes.astype(np.float32))
    ours, theirs = cpu_exp.exp_nonpositive(x), mx.exp(x)
    close(ours, theirs, tolerance=1.2e-7)
    # Where MLX's exp gives 0 so does this: a masked score weighs nothing at all.
    assert np.asarray(ours)[-4:].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert np.isnan(np.asarray(cpu_exp.exp_nonpositive(mx.array([math.nan])))).all()


@pytest.mark.parametrize("shape", [(1, 1000, 64), (16, 1, 1536), (3, 4099), (8192,)])
def test_activations_agree_with_mlx_s_at_every_shape_one_trace_serves(shape: tuple[int, ...]) -> None:
    gate = mx.random.normal(shape) * 6
    up = mx.random.normal(shape)
    # Absolute, near zero: MLX's gelu_approx takes 1 + tanh(y), which cancels for y far below zero (a tanh near -1
    # is good to 6e-8), and its silu rounds a gate far below zero to -0; ours keeps the small value.
    ones = mx.ones(shape)
    close(cpu_exp.swiglu(gate, ones), nn.silu(gate), tolerance=2e-6, floor=5e-7)
    close(cpu_exp.geglu(gate, ones), nn.gelu_approx(gate), tolerance=2e-6, floor=5e-7)
    close(cpu_exp.swiglu(gate, up), activations.swiglu(gate, up), tolerance=2e-6, floor=5e-7)
    close(cpu_exp.geglu(gate, up), nn.gelu_approx(gate) * up, tolerance=2e-6, floor=5e-7)


def test_activations_keep_their_limits_and_nan() -> None:
    limits = [-math.inf, -1e4, -100.0, -1e-30, 0.0, 1e-30, 100.0, 1e4, math.inf, math.nan]
    # Enough elements that ours runs, not MLX's own (`_MIN_ELEMENTS`).
    edges = mx.array(limits * 500)
    ones = mx.ones(edges.shape)
    for ours, theirs in ((cpu_exp.swiglu, nn.silu), (cpu_exp.geglu, nn.gelu_approx)):
        values, expected = np.asarray(ours(edges, ones))[:10], np.asarray(theirs(edges))[:10]
        finite = np.isfinite(limits)
        np.testing.assert_allclose(values[finite], expected[finite], rtol=2e-6, atol=5e-7)
        assert values[-1] != values[-1] and values[-2] == math.inf


def test_a_small_tensor_runs_mlx_s_own_fused_kernel() -> None:
    gate, up = mx.random.normal((1, 1, 1536)) * 4, mx.random.normal((1, 1, 1536))
    assert mx.array_equal(cpu_exp.swiglu(gate, up), activations.swiglu(gate, up))
    assert mx.array_equal(cpu_exp.geglu(gate, up), nn.gelu_approx(gate) * up)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_other_dtypes_run_mlx_s_own(dtype: mx.Dtype) -> None:
    gate = (mx.random.normal((4, 4096)) * 3).astype(dtype)
    up = mx.random.normal((4, 4096)).astype(dtype)
    assert mx.array_equal(cpu_exp.geglu(gate, up), nn.gelu_approx(gate) * up)
    assert mx.array_equal(cpu_exp.swiglu(gate, up), nn.silu(gate) * up)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 9, 3, 1, 1500, 64),
        (4, 4, 1, 1, 700, 256),
        (16, 9, 3, 1, 90, 64),
        (2, 9, 3, 9, 400, 64),
        (3, 8, 8, 2, 64, 32),
    ],
    ids=["smollm2-decode", "gemma3-decode", "sixteen-rows", "smollm2-verify", "no-grouping"],
)
def test_lazy_attention_gives_mlx_s_answer_for_every_mask_mlx_lm_makes(shape: tuple[int, ...]) -> None:
    batch, heads, _, rows, context, _ = shape
    queries, keys, values = shapes(*shape)
    padding = mx.array([3 * row for row in range(batch)])
    masks: list[mx.array | str | None] = [
        None,
        create_causal_mask(rows, offset=context - rows, left_padding=padding),
        create_causal_mask(rows, offset=context - rows, window_size=37),
        mx.where(create_causal_mask(rows, offset=context - rows, left_padding=padding), 0.0, -1e9),
        (mx.random.uniform(shape=(batch, heads, rows, context)) > 0.4) | (mx.arange(context) == context - 1),
    ]
    if rows > 1:
        masks.append("causal")
    for mask in masks:
        theirs = mlx_attention(queries, keys, values, scale=0.125, mask=mask)
        ours = cpu_exp.lazy_attention(queries, keys, values, 0.125, mask)
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-6, rtol=1e-4)


def test_a_row_whose_every_key_is_hidden_stays_finite() -> None:
    queries, keys, values = shapes(2, 4, 2, 1, 600, 32)
    hidden = (mx.arange(600) >= mx.array([0, 600])[:, None])[:, None, None, :]
    ours = np.asarray(cpu_exp.lazy_attention(queries, keys, values, 0.125, hidden))
    assert np.isfinite(ours).all()


def test_a_long_decode_step_is_taken_lazily_and_a_short_one_is_mlx_s(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []

    def counting(queries: mx.array, *args: object, **options: object) -> mx.array:
        calls.append(queries.shape)
        return mlx_attention(queries, *args, **options)

    monkeypatch.setattr(cpu_attention, "_mlx_attention", counting)
    long_step = shapes(1, 9, 3, 1, 2000, 64)
    ours = cpu_attention.attention(*long_step, scale=0.125, mask=None)
    assert calls == []
    np.testing.assert_allclose(np.asarray(ours), np.asarray(mlx_attention(*long_step, scale=0.125)), atol=2e-6)
    cpu_attention.attention(*shapes(1, 9, 3, 1, 300, 64), scale=0.125, mask=None)
    cpu_attention.attention(*[a.astype(mx.float16) for a in long_step], scale=0.125, mask=None)
    cpu_attention.attention(*long_step, scale=0.125, mask=None, sinks=mx.zeros((9,)))
    assert calls == [(1, 9, 1, 64)] * 3


def test_install_rebinds_the_eager_activations_and_leaves_the_rest() -> None:
    llama = importlib.import_module("mlx_lm.models.llama")
    gemma3_text = importlib.import_module("mlx_lm.models.gemma3_text")
    gemma4_text = importlib.import_module("mlx_lm.models.gemma4_text")
    assert cpu_exp.install()
    assert cpu_exp.install()
    assert llama.swiglu is cpu_exp.swiglu
    assert gemma3_text.MLP.__call__ is cpu_exp._gelu_mlp_call
    # mlx-lm's own, which other modules call inside a shapeless compile of their own, and a MLP that is not the
    # expression replaced, are left as they are.
    assert activations.swiglu is not cpu_exp.swiglu
    assert gemma4_text.MLP.__call__ not in cpu_exp._MLP_BODIES.values()
    assert nn.silu is mlx_activations.silu and nn.gelu_approx is mlx_activations.gelu_approx


def test_a_gated_mlp_gives_the_same_output_through_the_replacement() -> None:
    gemma3_text = importlib.import_module("mlx_lm.models.gemma3_text")
    cpu_exp.install()
    mlp = gemma3_text.MLP(64, 128)
    x = mx.random.normal((2, 5, 64))
    expected = mlp.down_proj(nn.gelu_approx(mlp.gate_proj(x)) * mlp.up_proj(x))
    close(mlp(x), expected, tolerance=1e-4, floor=1e-6)


def test_mlx_s_own_kernels_asked_for_keep_the_activations_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_exp.CHOICE_VARIABLE, "mlx")
    assert not cpu_exp.install()


def test_the_real_default_model_reads_and_writes_as_with_mlx_s_own(
    smollm2_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SmolLM2 as the server serves it on a CPU: a 200-token prompt's logits, and 12 greedy tokens decoded one at a
    # time over its cache, each step's attention taken lazily (the gate lowered to reach a 200-token context
    # without a 1,000-token prefill), and every gate activation through ours.
    info = resolve_model(str(smollm2_model))
    model = load_weights(attrs.evolve(info, float32_weights=True))
    text = "".join(f"def f{n}(x):\n    return x * {n} + {n * n}\n\n" for n in range(20))
    prompt = mx.array(load_tokenizer(info).encode(text)[:200])[None]
    assert prompt.shape[1] == 200
    lazy_calls = []

    def counting(*args: Any) -> mx.array:
        lazy_calls.append(args[0].shape)
        return cpu_exp.lazy_attention(*args)

    monkeypatch.setattr(cpu_attention, "lazy_attention", counting)
    read: dict[bool, tuple[np.ndarray, list[int]]] = {}
    gate = 1024
    for ours in (False, True):
        cpu_exp.use(ours=ours)
        monkeypatch.setattr(cpu_attention, "_MIN_LAZY_SCORES", gate if ours else 1 << 62)
        cache = make_prompt_cache(model)
        logits = model(prompt, cache=cache)[:, -1]
        first = np.asarray(logits)
        tokens = []
        for _ in range(12):
            token = mx.argmax(logits, axis=-1)
            tokens.append(token.item())
            logits = model(token[:, None], cache=cache)[:, -1]
        read[ours] = first, tokens
    cpu_exp.use(ours=True)
    # MLX's own attention in the first run; ours in every layer of the second's 12 steps.
    assert len(lazy_calls) == 12 * 30
    np.testing.assert_allclose(read[True][0], read[False][0], atol=2e-4, rtol=1e-4)
    assert read[True][1] == read[False][1]
