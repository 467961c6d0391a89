"""Affine-quantized weights with float16 scales, dequantized in float32 numpy arithmetic that rounds as float16 does.

`dequantize_half_scaled(words, scales, biases, group_size, bits, out)` takes a block of rows of packed weights (uint32)
with their float16 scales and biases widened to float32, and writes into `out` (float32) what MLX's `dequantize`
computes in float16, `code * scale + bias` rounded to float16 after the multiply and after the add, widened: the same
bits. `stays_finite` says where that holds: float16 would overflow to infinity where float32 does not. It owns nothing.

Why not MLX: on x86 MLX's float16 arithmetic converts each operand in software, 3-4 ns a value an op, where a float32
op takes 0.3 (issue #37). Why exact: a code (at most 8 bits) times a float16 scale (11) is exact in float32, and a sum
of two float16 values rounded to float32 (24 bits, at least 2 * 11 + 2) then to 11 bits is the sum rounded once to
11 (Figueroa's double rounding theorem); `half_rounded` is that rounding to 11 bits.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from stages.models.quant_codes import Packed, unpack_codes

Floats = npt.NDArray[np.float32]
# Dekker's splitting constant from float32's 24 significant bits to float16's 11: 2**(24 - 11) + 1.
_SPLIT = np.float32(8193.0)
# float16's largest finite value; a value at or below it in magnitude is never rounded to infinity.
HALF_MAX = 65504.0
# Values worked on at a time: a block that stays in a core's L2 cache runs each op about twice as fast.
_CACHED_VALUES = 1 << 16


def stays_finite(scales: Floats, biases: Floats, bits: int) -> bool:
    """Whether every code times its scale, plus its bias, stays finite in float16 (none is NaN or infinite)."""
    if not (np.isfinite(scales).all() and np.isfinite(biases).all()):
        return False
    largest = float(np.abs(scales).max(initial=0.0)) * ((1 << bits) - 1) + float(np.abs(biases).max(initial=0.0))
    return largest <= HALF_MAX


def half_rounded(values: Floats, spare: Floats) -> None:
    """Round float32 `values` in place as float16 holds them, to nearest, ties to even, the sign of zero kept.

    Dekker's split, `big - (big - x)` with `big = x * 8193`: the rounding to 11 significant bits, checked against
    float16 for every float32 significand (tests/stages/models/test_half_scales.py). Below float16's normal range the
    values met here (a code times a float16 scale, a sum of two float16 values) are multiples of 2**-24 with at most
    10 significant bits, which float16 holds exactly and the split leaves as they are. `spare` is scratch space of
    the same shape.
    """
    np.multiply(values, _SPLIT, out=spare)
    np.subtract(spare, values, out=values)
    np.subtract(spare, values, out=values)


def dequantize_half_scaled(
    words: Packed, scales: Floats, biases: Floats, group_size: int, bits: int, out: Floats
) -> None:
    """Write the rows of `words` (2-D, one row a weight row) dequantized into `out`, a float32 array of their shape.

    `scales` and `biases` are the rows' float16 groups widened to float32; `stays_finite` must hold for them.
    """
    columns = out.shape[-1]
    groups = columns // group_size
    step = max(1, _CACHED_VALUES // columns)
    work = np.empty((step, groups, group_size), np.float32)
    spare = np.empty_like(work)
    for start in range(0, out.shape[0], step):
        rows = slice(start, start + step)
        codes = unpack_codes(words[rows], bits)
        count = codes.shape[0]
        values, scratch = work[:count], spare[:count]
        np.multiply(codes.reshape(count, groups, group_size), scales[rows, :, None], out=values)
        half_rounded(values, scratch)
        np.add(values, biases[rows, :, None], out=values)
        half_rounded(values, scratch)
        out[rows] = values.reshape(count, columns)
