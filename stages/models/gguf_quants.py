"""GGUF tensors' blocks decoded with numpy: llama.cpp's values, and MLX's exact form where there is one.

`dequantize` gives a tensor's values as float32, computed as llama.cpp's
`dequantize_row_*` computes them (scales from float16 to float32, then
the same products and differences in the same order), so they are its
values to the bit; `tests/stages/models/test_gguf_quants.py` holds them
against the `gguf` package's own decoder for each type. The `gguf`
package is a test dependency only: the conversion runs on a serving
install, and the types one model uses are a few lines of numpy each.

`mlx_affine` gives the Q8_0 and Q5_0 tensors as MLX affine triples (packed
uint32, float16 scales and biases, group size 32) that dequantize to the
same values exactly: each block is `d × (q − offset)`, which is MLX's
`scale × q + bias` with scale `d` and bias `−offset × d`, both exact in
float16. A K-quant's sub-blocks (16 values in Q6_K, a scale that is a
product in Q4_K) have no exact MLX form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stages.models.gguf import GGUF_GROUP_SIZE, GGUFError
from stages.models.gguf_file import BF16, F16, F32, Q4_K, Q5_0, Q6_K, Q8_0, GGUFTensor

Floats = np.ndarray[Any, np.dtype[np.float32]]
Bytes = np.ndarray[Any, np.dtype[np.uint8]]
# Q8_0's signed values and Q5_0's 0..31 values, as MLX's unsigned ones (q + offset) and their bits.
_AFFINE = {Q8_0: (128, 8), Q5_0: (16, 5)}


def dequantize(tensor: GGUFTensor) -> Floats:
    """The tensor's values as float32, in its numpy shape.

    Raises:
        GGUFError: a type not decoded here.
    """
    if tensor.kind == F32:
        return tensor.data.view(np.float32).reshape(tensor.shape)
    if tensor.kind == F16:
        return tensor.data.view(np.float16).astype(np.float32).reshape(tensor.shape)
    if tensor.kind == BF16:
        return (tensor.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(tensor.shape)
    decode = _DECODERS.get(tensor.kind)
    if decode is None:
        raise GGUFError(f"GGUF tensor {tensor.name!r} is {tensor.type_name}, which is not decoded here")
    return decode(tensor.data).reshape(tensor.shape)


def mlx_affine(tensor: GGUFTensor) -> tuple[np.ndarray[Any, Any], Floats, Floats] | None:
    """The tensor as MLX's (packed uint32 weight, float16 scales, float16 biases), or None without an exact form."""
    if tensor.kind not in _AFFINE:
        return None
    offset, bits = _AFFINE[tensor.kind]
    scales, values = (_q8_0_parts if tensor.kind == Q8_0 else _q5_0_parts)(tensor.data)
    rows, columns = tensor.shape[0], tensor.shape[-1]
    unsigned = (values.astype(np.int16) + offset).astype(np.uint8).reshape(rows, columns)
    scales = scales.reshape(rows, columns // GGUF_GROUP_SIZE)
    return _pack(unsigned, bits), scales.astype(np.float16), (scales * -offset).astype(np.float16)


def _pack(unsigned: Bytes, bits: int) -> np.ndarray[Any, Any]:
    """Each row's values as MLX packs them: one little-endian bit stream, value i at bits [i*bits, (i+1)*bits)."""
    if bits == 8:
        return unsigned.view(np.uint32)
    stream = np.unpackbits(unsigned[..., None], axis=-1, bitorder="little")[..., :bits]
    return np.packbits(stream.reshape(unsigned.shape[0], -1), axis=-1, bitorder="little").view(np.uint32)


def _half(blocks: Bytes, at: int) -> Floats:
    """The float16 at byte `at` of each block, as a float32 column."""
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)


def _q8_0_parts(data: Bytes) -> tuple[Floats, np.ndarray[Any, Any]]:
    """Q8_0: a float16 scale, then 32 signed bytes."""
    blocks = data.reshape(-1, 34)
    return _half(blocks, 0), blocks[:, 2:].view(np.int8)


def _q5_0_parts(data: Bytes) -> tuple[Floats, np.ndarray[Any, Any]]:
    """Q5_0: a float16 scale, 32 high bits, 16 bytes of low nibbles (values j and j+16 share byte j)."""
    blocks = data.reshape(-1, 22)
    high = np.unpackbits(blocks[:, 2:6], axis=-1, bitorder="little").astype(np.int8)
    low = np.concatenate([blocks[:, 6:] & 0x0F, blocks[:, 6:] >> 4], axis=-1).astype(np.int8)
    return _half(blocks, 0), (low | (high << 4)) - 16


def _q8_0(data: Bytes) -> Floats:
    scales, values = _q8_0_parts(data)
    return np.asarray((scales * values).reshape(-1), dtype=np.float32)


def _q5_0(data: Bytes) -> Floats:
    scales, values = _q5_0_parts(data)
    return np.asarray((scales * values).reshape(-1), dtype=np.float32)


def _q4_k(data: Bytes) -> Floats:
    """Q4_K: 256 values in 8 groups of 32, each `d × scale × q − dmin × min` with 6-bit scales and mins."""
    blocks = data.reshape(-1, 144)
    d, dmin = _half(blocks, 0), _half(blocks, 2)
    scales, mins = _k_scales(blocks[:, 4:16])
    packed = blocks[:, 16:].reshape(-1, 4, 32)
    # Each 32 bytes hold two groups: the low nibbles, then the high ones.
    values = np.stack([packed & 0x0F, packed >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    return np.asarray(((d * scales)[..., None] * values - (dmin * mins)[..., None]).reshape(-1), dtype=np.float32)


def _k_scales(packed: Bytes) -> tuple[Floats, Floats]:
    """The 8 scales and 8 mins of a Q4_K/Q5_K block, 6 bits each in 12 bytes (llama.cpp's get_scale_min_k4)."""
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([first & 63, (third & 0x0F) | ((first >> 6) << 4)], axis=-1)
    mins = np.concatenate([second & 63, (third >> 4) | ((second >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _q6_k(data: Bytes) -> Floats:
    """Q6_K: 256 values in 16 groups of 16, each `d × scale × (q − 32)`, q's 4 low and 2 high bits apart."""
    blocks = data.reshape(-1, 210)
    low, high = blocks[:, :128].reshape(-1, 2, 2, 32), blocks[:, 128:192].reshape(-1, 2, 1, 32)
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)
    # Per half of 128: values 0-31 and 64-95 take low[0]'s nibbles, 32-63 and 96-127 low[1]'s; high's bit
    # pairs 0-1, 2-3, 4-5, 6-7 go to the four runs of 32 in order.
    nibbles = np.stack([low[:, :, 0] & 0x0F, low[:, :, 1] & 0x0F, low[:, :, 0] >> 4, low[:, :, 1] >> 4], axis=2)
    pairs = np.stack([(high[:, :, 0] >> shift) & 3 for shift in (0, 2, 4, 6)], axis=2)
    values = (nibbles | (pairs << 4)).astype(np.int8).reshape(-1, 16, 16) - 32
    return np.asarray(((_half(blocks, 208) * scales)[..., None] * values).reshape(-1), dtype=np.float32)


_DECODERS = {Q8_0: _q8_0, Q5_0: _q5_0, Q4_K: _q4_k, Q6_K: _q6_k}
