"""Dequantizing at load (stages/models/dequantize.py): the same bits as MLX's own `dequantize`, faster.

The reference is always MLX or mlx-lm itself, run beside: `mx.dequantize(...).astype(dtype)` for one weight,
`dequantize_model` then `set_dtype` for a model, as `load_weights` did before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx.nn.layers.base import Module
from mlx.nn.layers.embedding import Embedding
from mlx.nn.layers.normalization import RMSNorm
from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear
from mlx.utils import tree_flatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear
from mlx_lm.utils import dequantize_model, load_model

from stages.models.dequantize import AFFINE_BITS, AFFINE_GROUP_SIZES, dequantize_layers, dequantized
from stages.models.loading import load_weights, resolve_model
from stages.models.quant_codes import unpack_codes

SCALE_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
SERVED_DTYPES = (mx.float32, mx.bfloat16, mx.float16)
_UNSIGNED = {2: mx.uint16, 4: mx.uint32}


def same_bits(left: mx.array, right: mx.array) -> bool:
    """Equal shape, dtype and bits (NaN included, -0.0 apart from 0.0)."""
    if left.shape != right.shape or left.dtype != right.dtype:
        return False
    unsigned = _UNSIGNED[left.dtype.size]
    return bool(mx.array_equal(left.view(unsigned), right.view(unsigned)).item())


def random_quantized(
    shape: tuple[int, ...], group_size: int, bits: int, dtype: mx.Dtype, seed: int
) -> tuple[mx.array, mx.array, mx.array]:
    """Random words (every code occurs) with random scales and biases of both signs, from float16's subnormals up."""
    rng = np.random.default_rng(seed)
    *lead, columns = shape
    words = rng.integers(0, 1 << 32, (*lead, columns * bits // 32), dtype=np.uint32)
    groups = (*lead, columns // group_size)
    magnitudes = 10.0 ** rng.integers(-7, 2, groups)
    scales = rng.standard_normal(groups) * magnitudes
    biases = rng.standard_normal(groups) * magnitudes * (1 << bits) / 2
    return mx.array(words), mx.array(scales).astype(dtype), mx.array(biases).astype(dtype)


@pytest.mark.parametrize("bits", sorted(AFFINE_BITS))
def test_the_codes_are_mlxs_layout(bits: int) -> None:
    words, _, _ = random_quantized((6, 384), 128, bits, mx.float32, seed=bits)
    ones, zeros = mx.ones((6, 3)), mx.zeros((6, 3))
    expected = mx.dequantize(words, ones, zeros, 128, bits).astype(mx.uint8)
    codes = unpack_codes(np.asarray(words), bits)
    assert codes.dtype == np.uint8 and codes.shape == (6, 384)
    assert np.array_equal(codes, np.asarray(expected))


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES, ids=str)
@pytest.mark.parametrize("group_size", sorted(AFFINE_GROUP_SIZES))
@pytest.mark.parametrize("bits", sorted(AFFINE_BITS))
def test_the_same_bits_as_mx_dequantize(bits: int, group_size: int, scale_dtype: mx.Dtype) -> None:
    words, scales, biases = random_quantized((16, 768), group_size, bits, scale_dtype, seed=bits * 1000 + group_size)
    for served in SERVED_DTYPES:
        expected = mx.dequantize(words, scales, biases, group_size, bits).astype(served)
        assert same_bits(dequantized(words, scales, biases, group_size, bits, served), expected), served


def test_a_quantized_weight_of_real_values_and_experts() -> None:
    """mx.quantize's own output, of a stack of experts' weights (a SwitchLinear's three axes)."""
    mx.random.seed(7)
    weight = mx.random.normal((3, 40, 256)).astype(mx.bfloat16)
    words, scales, biases = mx.quantize(weight, 64, 5)
    expected = mx.dequantize(words, scales, biases, 64, 5).astype(mx.float32)
    assert same_bits(dequantized(words, scales, biases, 64, 5, mx.float32), expected)


def test_float16_scales_that_overflow_give_mlxs_infinities() -> None:
    """Past float16's range the float32 emulation would stay finite; MLX's float16 arithmetic is used there."""
    words, scales, biases = random_quantized((8, 256), 64, 8, mx.float16, seed=3)
    scales = scales * 0 + 1000
    expected = mx.dequantize(words, scales, biases, 64, 8).astype(mx.float32)
    assert mx.isinf(expected).any().item()
    assert same_bits(dequantized(words, scales, biases, 64, 8, mx.float32), expected)


def test_a_width_mlx_does_not_pack_is_refused() -> None:
    with pytest.raises(ValueError, match="not 7"):
        unpack_codes(np.zeros((2, 7), np.uint32), 7)
    with pytest.raises(ValueError, match="uint32"):
        unpack_codes(np.zeros((2, 7), np.int32), 4)


class Mixed(Module):
    """One of each layer the walk meets, in several widths and scale dtypes, and one it must leave to mlx-lm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = QuantizedEmbedding(100, 64, group_size=32, bits=8)
        self.five = QuantizedLinear(128, 48, bias=True, group_size=32, bits=5)
        self.three = QuantizedLinear(256, 16, bias=False, group_size=128, bits=3)
        self.experts = QuantizedSwitchLinear(64, 32, 4, bias=True, group_size=64, bits=6)
        self.fp4 = QuantizedLinear(64, 32, bias=False, group_size=32, bits=4, mode="mxfp4")
        self.norm = RMSNorm(64)


def mixed_model() -> Mixed:
    mx.random.seed(11)
    model = Mixed()
    for layer, dtype in ((model.five, mx.bfloat16), (model.embed, mx.float16)):
        scaled: Any = layer
        scaled.scales, scaled.biases = scaled.scales.astype(dtype), scaled.biases.astype(dtype)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("served", SERVED_DTYPES, ids=str)
def test_a_model_walked_as_mlx_lm_walks_it(served: mx.Dtype) -> None:
    reference = cast(Any, dequantize_model(mixed_model()))
    reference.set_dtype(served)
    model = mixed_model()
    assert dequantize_layers(model, served) == 4
    # mxfp4 is not affine: it is left quantized, for mlx-lm to take after.
    assert isinstance(model.fp4, QuantizedLinear)
    model = cast(Any, dequantize_model(model))
    model.set_dtype(served)
    layers = {name: type(module) for name, module in model.named_modules()}
    assert layers == {name: type(module) for name, module in reference.named_modules()}
    assert layers["experts"] is SwitchLinear and layers["embed"] is Embedding
    ours, theirs = dict(tree_flatten(model.parameters())), dict(tree_flatten(reference.parameters()))
    assert ours.keys() == theirs.keys()
    assert all(same_bits(ours[key], theirs[key]) for key in ours)


def reference_load(path: Path, served: mx.Dtype) -> Any:
    """What `load_weights` did before issue #37: mlx-lm's `dequantize_model`, then `set_dtype`."""
    model, _ = load_model(path)
    model = dequantize_model(model)
    model.set_dtype(served)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("served", ["float32", "bfloat16"])
def test_load_weights_gives_the_same_model_and_logits(served: str) -> None:
    """The shaped Qwen3 (4-bit, groups of 64): the same weights, bit for bit, and so the same logits."""
    info = resolve_model("shaped:qwen3-0.6b-2l")
    forms: dict[str, dict[str, Any]] = {
        "float32": {"float32_weights": True},
        "bfloat16": {"sixteen_bit_weights": "bfloat16"},
    }
    model = cast(Any, load_weights(attrs.evolve(info, **forms[served])))
    reference = reference_load(info.path, getattr(mx, served))
    ours, theirs = dict(tree_flatten(model.parameters())), dict(tree_flatten(reference.parameters()))
    assert ours.keys() == theirs.keys()
    assert all(same_bits(ours[key], theirs[key]) for key in ours)
    tokens = mx.array([[3, 17, 42, 99, 5, 64, 8, 23]])
    assert same_bits(model(tokens), reference(tokens))
