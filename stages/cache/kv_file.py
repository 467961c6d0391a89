"""The disk tier's file format: one prompt-cache entry as a safetensors file.

Written by hand here, readable by `mx.load`: the tokens the entry holds as an int32 tensor, each
layer's keys and values (a quantized layer's packed values as uint32 with their `.scales` and
`.biases`), and metadata naming the format, the KV scheme where it is quantized (`kv_scheme`,
"q8g64"), the model's fingerprint, the entry's space (absent for the base model; an adapter's name
and weights' fingerprint for an adapter's KV) and a CRC-32 of the data. Pure bytes in and out: no
index, no MLX call, so the spill worker can write a file without the model thread.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from stages.kv.tensors import Tensor

FORMAT = "mlx-relay/kv-1"
SUFFIX = ".safetensors"
# The base model's space: its files carry no `adapter` metadata, as before adapters had files.
BASE_SPACE = ""
_TOKENS = "tokens"
# safetensors data starts 8-aligned, so every tensor can be viewed in place.
_ALIGN = 8
# memoryview format -> safetensors dtype, and each dtype's item size.
_DTYPES = {"f": "F32", "e": "F16", "bfloat16": "BF16", "i": "I32", "I": "U32"}
_ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "U32": 4}
# The KV scheme of full-precision files, which name none (as before quantized KV).
FULL_SCHEME = "full"
# Enough of each weight file to tell two models of the same shape apart
# without reading gigabytes at every start.
_FINGERPRINT_SAMPLE = 1 << 20


@attrs.frozen(kw_only=True)
class Restored:
    tokens: tuple[int, ...]
    prompt_len: int
    space: str
    tensors: dict[str, Tensor]


def tensor(name: str, buffer: Any) -> Tensor | None:
    """`buffer` (an evaluated MLX array, an `array`) as a tensor; None if it cannot be written as is."""
    view = memoryview(buffer)
    dtype = _DTYPES.get(view.format)
    if dtype is None or not view.c_contiguous:
        return None
    return Tensor(name, dtype, tuple(view.shape or (len(view),)), view)


def token_tensor(tokens: Sequence[int]) -> Tensor:
    ids = array("i", tokens)
    return Tensor(_TOKENS, "I32", (len(ids),), memoryview(ids))


def header(
    tensors: Sequence[Tensor], *, fingerprint: str, prompt_len: int, space: str, kv_scheme: str = FULL_SCHEME
) -> bytes:
    """The length-prefixed JSON header of a file holding `tensors`, padded so the data is aligned."""
    entries: dict[str, Any] = {}
    offset, crc = 0, 0
    for item in tensors:
        entries[item.name] = {
            "dtype": item.dtype,
            "shape": list(item.shape),
            "data_offsets": [offset, offset + item.data.nbytes],
        }
        offset += item.data.nbytes
        crc = zlib.crc32(item.data, crc)
    metadata = {"format": FORMAT, "fingerprint": fingerprint, "prompt_len": str(prompt_len), "crc32": str(crc)}
    if space != BASE_SPACE:
        metadata["adapter"] = space
    if kv_scheme != FULL_SCHEME:
        metadata["kv_scheme"] = kv_scheme
    text = json.dumps({"__metadata__": metadata, **entries}).encode()
    text += b" " * (-(8 + len(text)) % _ALIGN)
    return len(text).to_bytes(8, "little") + text


def parse(data: bytes, fingerprint: str) -> Restored | None:
    """A whole file, checked (format, fingerprint, layout, checksum); None if any check fails."""
    try:
        length = int.from_bytes(data[:8], "little")
        head = json.loads(data[8 : 8 + length])
        space = _space(head, fingerprint)
        if space is None:
            return None
        body = memoryview(data)[8 + length :]
        metadata = head.pop("__metadata__")
        tensors = {name: _tensor(name, spec, body) for name, spec in head.items()}
        ends = [spec["data_offsets"][1] for spec in head.values()]
        if max(ends, default=0) != len(body) or zlib.crc32(body) != int(metadata["crc32"]):
            return None
        tokens = tensors.pop(_TOKENS)
        ids = array("i")
        ids.frombytes(tokens.data)
        return Restored(tokens=tuple(ids), prompt_len=int(metadata["prompt_len"]), space=space, tensors=tensors)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def indexed(path: Path, fingerprint: str) -> tuple[str, tuple[int, ...]] | None:
    """A file's space and the tokens it holds, from its header and token tensor alone (a start-up scan)."""
    try:
        with path.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if length > path.stat().st_size:
                return None
            head = json.loads(file.read(length))
            space = _space(head, fingerprint)
            if space is None:
                return None
            start, end = head[_TOKENS]["data_offsets"]
            file.seek(8 + length + start)
            ids = array("i")
            ids.frombytes(file.read(end - start))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return space, tuple(ids)


def model_fingerprint(path: Path, kv_scheme: str = FULL_SCHEME) -> str:
    """A digest of the model's config and a sample of each weight file, and of the KV scheme when quantized.

    The scheme is part of the fingerprint, so a file of another scheme is
    never this server's (it is not restored); full precision adds nothing,
    so files written before quantized KV still are.
    """
    digest = hashlib.sha256(FORMAT.encode())
    if kv_scheme != FULL_SCHEME:
        digest.update(f"kv_scheme:{kv_scheme}".encode())
    digest.update((path / "config.json").read_bytes())
    for weights in sorted(path.glob("*" + SUFFIX)):
        size = weights.stat().st_size
        digest.update(f"{weights.name}:{size}".encode())
        with weights.open("rb") as file:
            digest.update(file.read(_FINGERPRINT_SAMPLE))
            file.seek(max(0, size - _FINGERPRINT_SAMPLE))
            digest.update(file.read(_FINGERPRINT_SAMPLE))
    return digest.hexdigest()


def adapter_fingerprint(config: Path, weights: Path) -> str:
    """A digest of an adapter's config and all of its weights.

    All of them, not a sample: an adapter is small beside its model, and two
    trainings of one adapter can differ anywhere in the file.
    """
    digest = hashlib.sha256(FORMAT.encode())
    digest.update(config.read_bytes())
    with weights.open("rb") as file:
        while chunk := file.read(_FINGERPRINT_SAMPLE):
            digest.update(chunk)
    return digest.hexdigest()


def _space(head: Any, fingerprint: str) -> str | None:
    """The space a header's file belongs to, or None if the file is not ours or not this model's."""
    metadata = head.get("__metadata__", {}) if isinstance(head, dict) else {}
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT or metadata.get("fingerprint") != fingerprint:
        return None
    space = metadata.get("adapter", BASE_SPACE)
    return space if isinstance(space, str) else None


def _tensor(name: str, spec: dict[str, Any], body: memoryview) -> Tensor:
    start, end = spec["data_offsets"]
    shape = tuple(int(n) for n in spec["shape"])
    if end - start != math.prod(shape) * _ITEM_BYTES[spec["dtype"]] or not 0 <= start <= end <= len(body):
        raise ValueError(f"tensor {name} does not match its shape")
    return Tensor(name, spec["dtype"], shape, body[start:end])
