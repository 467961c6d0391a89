"""A GGUF file's metadata and raw tensors, read with numpy.

`mx.load` reads GGUF only where its bundled reader knows every tensor
type (F32, F16, Q4_0, Q4_1, Q8_0): a K-quant model (Gemma 3 270M's
Q4_K_M mixes Q4_K, Q5_0, Q6_K and Q8_0) fails to load at all. This reads
the container itself, as the GGUF specification lays it out (version 3:
a header, typed key/value metadata, tensor records, then the aligned
data), and hands each tensor's blocks over as a read-only memory map, for
`stages/models/gguf_quants.py` to decode.

Takes a path; gives `GGUFFile` (metadata as Python values, tensors in
numpy's row-major shape). Owns nothing past the call but the memory map.
`read_header` reads the header alone from anything that reads bytes in
order: a pull plans from the first bytes of a download
(`stages/models/gguf_header.py`).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np

from stages.models.gguf import GGUFError

# The specification's default, when general.alignment is absent.
DEFAULT_ALIGNMENT = 32
# ggml_type ids and their blocks: (values per block, bytes per block).
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q4_K, Q5_K, Q6_K, BF16 = 12, 13, 14, 30
BLOCKS = {
    F32: (1, 4),
    F16: (1, 2),
    BF16: (1, 2),
    Q4_0: (32, 18),
    Q4_1: (32, 20),
    Q5_0: (32, 22),
    Q5_1: (32, 24),
    Q8_0: (32, 34),
    Q4_K: (256, 144),
    Q5_K: (256, 176),
    Q6_K: (256, 210),
}
TYPE_NAMES = {
    F32: "F32",
    F16: "F16",
    BF16: "BF16",
    Q4_0: "Q4_0",
    Q4_1: "Q4_1",
    Q5_0: "Q5_0",
    Q5_1: "Q5_1",
    Q8_0: "Q8_0",
    Q4_K: "Q4_K",
    Q5_K: "Q5_K",
    Q6_K: "Q6_K",
}
# GGUF metadata value types 0-12, except STRING (8) and ARRAY (9): their struct format.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@attrs.frozen
class GGUFTensor:
    """One tensor: its ggml type, numpy shape (rows first) and its stored bytes."""

    name: str
    kind: int
    shape: tuple[int, ...]
    data: np.ndarray[Any, np.dtype[np.uint8]]

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.kind, f"type {self.kind}")


@attrs.frozen
class GGUFFile:
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]


@attrs.frozen
class GGUFHeader:
    """What precedes a GGUF file's tensor data: its metadata and tensor records, and where the data starts."""

    metadata: dict[str, Any]
    # (name, ggml type, dimensions innermost first, offset from the data's start) per tensor.
    records: list[tuple[str, int, tuple[int, ...], int]]
    data_start: int


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...

    def tell(self) -> int: ...


def read_gguf_file(path: Path) -> GGUFFile:
    """The metadata and tensors of GGUF file `path`.

    Raises:
        GGUFError: not a GGUF file of version 2 or 3, or a tensor of a type
            whose block size is not known here.
    """
    with path.open("rb") as handle:
        header = read_header(handle, str(path))
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    start = header.data_start
    tensors = {name: _tensor(mapped, name, kind, dims, start + at) for name, kind, dims, at in header.records}
    return GGUFFile(metadata=header.metadata, tensors=tensors)


def read_header(handle: Readable, source: str) -> GGUFHeader:
    """The header of the GGUF file `handle` reads from its first byte (a file, or the start of a download).

    Raises:
        GGUFError: not a GGUF file of version 2 or 3, or it ends inside its header.
    """
    try:
        magic, version, tensor_count, kv_count = struct.unpack("<4sIQQ", handle.read(24))
        if magic != b"GGUF" or version not in (2, 3):
            raise GGUFError(f"{source} is not a GGUF file of version 2 or 3")
        metadata = {_string(handle): _value(handle, _u32(handle)) for _ in range(kv_count)}
        records = [_tensor_record(handle) for _ in range(tensor_count)]
    except struct.error:
        raise GGUFError(f"{source} ends inside its GGUF header") from None
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    return GGUFHeader(metadata=metadata, records=records, data_start=-(-handle.tell() // alignment) * alignment)


def _tensor(mapped: np.memmap[Any, Any], name: str, kind: int, dims: tuple[int, ...], at: int) -> GGUFTensor:
    if kind not in BLOCKS:
        raise GGUFError(f"GGUF tensor {name!r} has ggml type {kind}, which is not supported")
    values, size = BLOCKS[kind]
    count = int(np.prod(dims))
    # GGUF lists dimensions innermost first; numpy's shape is the reverse.
    return GGUFTensor(name, kind, tuple(reversed(dims)), mapped[at : at + count // values * size])


def _tensor_record(handle: Readable) -> tuple[str, int, tuple[int, ...], int]:
    name = _string(handle)
    rank = _u32(handle)
    dims = struct.unpack(f"<{rank}Q", handle.read(8 * rank))
    kind, offset = struct.unpack("<IQ", handle.read(12))
    return name, kind, dims, offset


def _value(handle: Readable, kind: int) -> Any:
    if kind == _STRING:
        return _string(handle)
    if kind == _ARRAY:
        item, count = struct.unpack("<IQ", handle.read(12))
        if item in _SCALARS:
            fmt = _SCALARS[item]
            return list(struct.unpack(f"<{count}{fmt}", handle.read(count * struct.calcsize(fmt))))
        return [_value(handle, item) for _ in range(count)]
    if kind not in _SCALARS:
        raise GGUFError(f"GGUF metadata value type {kind} is not known")
    fmt = _SCALARS[kind]
    return struct.unpack(f"<{fmt}", handle.read(struct.calcsize(fmt)))[0]


def _string(handle: Readable) -> str:
    (length,) = struct.unpack("<Q", handle.read(8))
    return handle.read(length).decode("utf-8", errors="replace")


def _u32(handle: Readable) -> int:
    value: int = struct.unpack("<I", handle.read(4))[0]
    return value
