"""The integer codes of MLX's affine-quantized weights, unpacked with numpy (issue #37).

`unpack_codes(packed, bits)` takes a weight as MLX packs it (uint32 words, `bits` of 2, 3, 4, 5, 6 or 8) and
gives its codes as uint8, one per value, in the weight's order: the last axis grows from `words` to
`words * 32 // bits`. It owns nothing.

MLX's layout, as its `dequantize` reads it (mlx/ops.cpp, `affine_dequantize`) and the tests check against it: each
row is one little-endian bit stream, value `i` in bits `[i * bits, (i + 1) * bits)`, low bit first, a value of
3, 5 or 6 bits crossing from one word into the next where it falls. On a little-endian machine the row's words
are that stream's bytes in order, so every 8 values fill exactly `bits` bytes, and no value spans more than two.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt

Codes = npt.NDArray[np.uint8]
Packed = npt.NDArray[np.uint32]
# The widths whose values fall on byte boundaries: a byte holds 8 // bits of them, low bits first.
_WHOLE_IN_A_BYTE = (2, 4)
# Every 8 values take exactly `bits` bytes, whatever the width.
_VALUES_PER_CHUNK = 8


def unpack_codes(packed: Packed, bits: int) -> Codes:
    """The codes of `packed` (any shape, the last axis its words), one uint8 per value.

    Raises:
        ValueError: `bits` is not a width MLX's affine mode packs, `packed` is not uint32, or this machine is
            big-endian (its words' bytes are not the stream's order).
    """
    if packed.dtype != np.uint32:
        raise ValueError(f"packed weights are uint32, not {packed.dtype}")
    if sys.byteorder != "little":
        raise ValueError("the packed layout is read as little-endian bytes")
    stream = np.ascontiguousarray(packed).view(np.uint8)
    if bits == 8:
        return stream
    if bits in _WHOLE_IN_A_BYTE:
        return _unpack_bytes(stream, bits)
    if bits in (3, 5, 6):
        return _unpack_chunks(stream, bits)
    raise ValueError(f"MLX's affine mode packs 2, 3, 4, 5, 6 or 8 bits, not {bits}")


def _unpack_bytes(stream: Codes, bits: int) -> Codes:
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    codes = np.empty((*stream.shape, per_byte), np.uint8)
    for slot in range(per_byte):
        np.bitwise_and(stream >> (slot * bits), mask, out=codes[..., slot])
    return codes.reshape(*stream.shape[:-1], -1)


def _unpack_chunks(stream: Codes, bits: int) -> Codes:
    """3, 5 and 6 bits: each chunk of `bits` bytes holds 8 values, one byte column at a time.

    A column is copied out contiguous once, so the shifts and masks below run on contiguous arrays, numpy's fast
    loops; only the writes into the interleaved result are strided.
    """
    chunks = stream.reshape(*stream.shape[:-1], -1, bits)
    columns = [np.ascontiguousarray(chunks[..., column]) for column in range(bits)]
    mask = (1 << bits) - 1
    codes = np.empty((*chunks.shape[:-1], _VALUES_PER_CHUNK), np.uint8)
    for slot in range(_VALUES_PER_CHUNK):
        column, shift = divmod(slot * bits, 8)
        value = columns[column] >> shift
        if shift + bits > 8:
            # The value's high bits open the next byte; uint8 drops what lies past them, and the mask the rest.
            value |= columns[column + 1] << (8 - shift)
        np.bitwise_and(value, mask, out=codes[..., slot])
    return codes.reshape(*stream.shape[:-1], -1)
