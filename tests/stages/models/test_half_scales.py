"""float16 arithmetic done in float32 (stages/models/half_scales.py), held to MLX's own float16 at every value it meets.

The rounding is checked exhaustively where that is cheap: every float32 significand (the rounding depends on nothing
else within float16's normal range), and every float16 scale times every 8-bit code.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from stages.models.half_scales import HALF_MAX, dequantize_half_scaled, half_rounded, stays_finite
from stages.models.quant_codes import unpack_codes


def as_mlx_half(values: np.ndarray) -> np.ndarray:
    """float32 `values` rounded to float16 by MLX and widened back, as float32 bits."""
    return np.asarray(mx.array(values).astype(mx.float16).astype(mx.float32)).view(np.uint32)


def rounded(values: np.ndarray) -> np.ndarray:
    values = values.copy()
    half_rounded(values, np.empty_like(values))
    return values.view(np.uint32)


@pytest.mark.parametrize("exponent", [0, -14, 15], ids=["one", "smallest-normal", "largest"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["positive", "negative"])
def test_every_significand_rounds_as_float16(exponent: int, sign: float) -> None:
    significands = np.arange(1 << 23, dtype=np.uint32) | np.uint32(127 << 23)
    values = significands.view(np.float32) * np.float32(sign * 2.0**exponent)
    if exponent == 15:
        # Past 65504 float16 holds nothing but infinity, which callers rule out first.
        values = values[np.abs(values) <= HALF_MAX]
    assert np.array_equal(rounded(values), as_mlx_half(values))


def test_the_sign_of_zero_is_kept() -> None:
    assert rounded(np.array([0.0, -0.0], np.float32)).tolist() == [0, 1 << 31]


def test_every_float16_scale_times_every_code() -> None:
    """Products below float16's normal range too: those are exact, and the rounding leaves them so."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    halves = halves[np.isfinite(halves)]
    codes = np.arange(256, dtype=np.uint8)[:, None]
    products = codes * halves.astype(np.float32)
    expected = np.asarray((mx.array(codes) * mx.array(halves)).astype(mx.float32)).view(np.uint32)
    # Where float16 overflows the caller has refused already (`stays_finite`).
    kept = np.abs(products) <= HALF_MAX
    assert np.array_equal(rounded(products)[kept], expected[kept])


def test_overflow_and_non_finite_values_are_refused() -> None:
    scales, biases = np.full((2, 3), 1.0, np.float32), np.zeros((2, 3), np.float32)
    assert stays_finite(scales, biases, 8)
    assert not stays_finite(scales * 257, biases, 8)
    assert stays_finite(scales * 256, biases, 8) and not stays_finite(scales * 256, biases + 1000, 8)
    assert not stays_finite(scales, np.full((2, 3), np.nan, np.float32), 8)
    assert not stays_finite(np.full((2, 3), np.inf, np.float32), biases, 2)


def test_a_block_is_mx_dequantize_in_float16() -> None:
    rng = np.random.default_rng(5)
    words = rng.integers(0, 1 << 32, (40, 3 * 128 * 5 // 32), dtype=np.uint32)
    scales = mx.array(rng.standard_normal((40, 3)) * 1e-3).astype(mx.float16)
    biases = mx.array(rng.standard_normal((40, 3)) * 1e-2).astype(mx.float16)
    expected = mx.dequantize(mx.array(words), scales, biases, 128, 5).astype(mx.float32)
    wide = np.asarray(scales.astype(mx.float32)), np.asarray(biases.astype(mx.float32))
    out = np.empty((40, 384), np.float32)
    dequantize_half_scaled(words, *wide, 128, 5, out)
    assert np.array_equal(out.view(np.uint32), np.asarray(expected).view(np.uint32))
    assert unpack_codes(words, 5).shape == out.shape
