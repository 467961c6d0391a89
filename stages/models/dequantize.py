"""Quantized layers made dense for the float32 and 16-bit serving forms, faster than mlx-lm does it (issue #37).

`dequantize_layers(model, dtype)` takes a loaded mlx-lm model and the dtype its weights are to be served in, and
replaces each affine-quantized `QuantizedLinear`, `QuantizedEmbedding` and mlx-lm `QuantizedSwitchLinear` of 2, 3,
4, 5, 6 or 8 bits in groups of 32, 64 or 128 with the dense layer mlx-lm's `dequantize_model` makes of it, its
weight already in `dtype` and evaluated: bit for bit `mx.dequantize(...).astype(dtype)`. Any other quantized layer
(another mode, such as mxfp4, or a layer class it does not know) is left as it is, for `dequantize_model` to take
after it. It owns nothing past the call.

Why it is faster (docs/benchmarks.md, "Dequantizing at load"): on the CPU, MLX's `dequantize` is a graph of
whole-array ops, which for 3, 5 and 6 bits splits every word into 32 single bits (a uint32 each) and sums them back,
and which works in the scales' dtype, float16's in software. Here numpy unpacks the codes from the bytes
(stages/models/quant_codes.py); MLX's own multiply and add apply float32 and bfloat16 scales, and float16 ones are
applied in float32 numpy arithmetic that rounds as float16 does (stages/models/half_scales.py); a block of rows at
a time, written into the one result, so no whole-matrix intermediate faults in fresh pages.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx.nn.layers.embedding import Embedding
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear
from mlx.utils import tree_unflatten

from stages.models.half_scales import Floats, dequantize_half_scaled, stays_finite
from stages.models.quant_codes import unpack_codes

# What MLX's affine mode packs and groups; anything else is left to mlx-lm.
AFFINE_BITS = frozenset({2, 3, 4, 5, 6, 8})
AFFINE_GROUP_SIZES = frozenset({32, 64, 128})
# Values dequantized in one block: with MLX's arithmetic the 262k x 640 embedding ran at 12 ns a value made whole
# (every op's intermediate faulted in fresh pages), at 6.8 in blocks of this size, which reuse MLX's cached buffers.
BLOCK_VALUES = 1 << 20


def dequantize_layers(model: Any, dtype: mx.Dtype) -> int:
    """Replace `model`'s affine-quantized layers with dense ones whose weights are in `dtype`; how many it replaced.

    Each layer's weight is evaluated as it is made, so only one layer's codes are held at a time.
    """
    dense = [(name, layer) for name, module in model.named_modules() if (layer := _dense(module, dtype)) is not None]
    if dense:
        model.update_modules(tree_unflatten(dense))
    return len(dense)


def dequantized(
    weight: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int, dtype: mx.Dtype
) -> mx.array:
    """`mx.dequantize(weight, scales, biases, group_size, bits).astype(dtype)`, the same bits, evaluated.

    Raises:
        ValueError: `bits` is not one MLX's affine mode packs.
    """
    shape = (*weight.shape[:-1], weight.shape[-1] * 32 // bits)
    step = max(1, BLOCK_VALUES // shape[-1])
    source = _Rows(weight, scales, biases, group_size, bits, step)
    served = mx.zeros((source.count, shape[-1]), dtype)
    for start in range(0, source.count, step):
        rows = slice(start, start + step)
        # Written in place: this is the array's only reference, so MLX donates its buffer to the update.
        served[rows] = source.dequantized(rows).astype(dtype)
        mx.eval(served)
    return served.reshape(shape)


class _Rows:
    """One weight's rows, its leading axes made one, dequantized a block of `step` rows at a time."""

    def __init__(
        self, weight: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int, step: int
    ) -> None:
        scales, biases = scales.reshape(-1, scales.shape[-1]), biases.reshape(-1, biases.shape[-1])
        self.scales, self.biases, self.group_size, self.bits = scales, biases, group_size, bits
        self.packed = np.asarray(weight.reshape(-1, weight.shape[-1]))
        self.count = self.packed.shape[0]
        self.half = _widened(scales, biases, bits)
        # The float16 path's block, reused: mx.array copies it out.
        self.buffer = np.empty((min(step, self.count), self.packed.shape[1] * 32 // bits), np.float32)

    def dequantized(self, rows: slice) -> mx.array:
        packed = self.packed[rows]
        if self.half is not None:
            out = self.buffer[: packed.shape[0]]
            dequantize_half_scaled(packed, self.half[0][rows], self.half[1][rows], self.group_size, self.bits, out)
            return mx.array(out)
        codes = mx.array(unpack_codes(packed, self.bits))
        scales, biases = self.scales[rows], self.biases[rows]
        grouped = codes.reshape(*scales.shape, self.group_size)
        # uint8 codes times the scales promote to the scales' dtype, as mx.dequantize's uint32 words do.
        return (grouped * mx.expand_dims(scales, -1) + mx.expand_dims(biases, -1)).reshape(codes.shape)


def _widened(scales: mx.array, biases: mx.array, bits: int) -> tuple[Floats, Floats] | None:
    """float16 scales and biases as float32 numpy arrays, for stages/models/half_scales.py; else None.

    None too where float16 would overflow: MLX's own float16 arithmetic then says what that gives.
    """
    if scales.dtype != mx.float16:
        return None
    widened = np.asarray(scales.astype(mx.float32)), np.asarray(biases.astype(mx.float32))
    return widened if stays_finite(*widened, bits) else None


def _dense(module: Any, dtype: mx.Dtype) -> Any:
    """The dense layer `module` becomes, as mlx-lm's `dequantize_model` makes it; None where this module leaves it."""
    from mlx_lm.models.switch_layers import SwitchLinear

    if not _affine(module):
        return None
    weight = dequantized(module.weight, module.scales, module.biases, module.group_size, module.bits, dtype)
    has_bias = "bias" in module
    layer: Any
    if isinstance(module, QuantizedEmbedding):
        layer = Embedding(weight.shape[0], weight.shape[1])
    elif isinstance(module, QuantizedLinear):
        layer = Linear(weight.shape[1], weight.shape[0], bias=has_bias)
    else:
        layer = SwitchLinear(weight.shape[2], weight.shape[1], weight.shape[0], bias=has_bias)
    layer.weight = weight
    if has_bias:
        layer.bias = module.bias
    return layer


def _affine(module: Any) -> bool:
    """An affine-quantized layer of a class mlx-lm's walk knows, in a width and group size MLX packs."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    return (
        isinstance(module, (QuantizedLinear, QuantizedEmbedding, QuantizedSwitchLinear))
        and getattr(module, "mode", "affine") == "affine"
        and module.get("biases") is not None
        and module.bits in AFFINE_BITS
        and module.group_size in AFFINE_GROUP_SIZES
        and module.weight.dtype == mx.uint32
    )
