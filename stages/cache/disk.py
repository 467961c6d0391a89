"""Disk tier of the prompt cache: evicted entries as files, bounded in bytes.

Each entry is one safetensors file (written by hand here, readable by
`mx.load`): the tokens it holds as an int32 tensor, each layer's keys and
values, and metadata naming the format, the model's fingerprint and a
CRC-32 of the data. Files live in a folder per model fingerprint, so a
cache folder shared by several models never serves one model's KV to
another.

- Write: on the gateway's spill worker thread, never the model thread.
  The bytes come from memoryviews the model thread took of evaluated
  arrays, so writing needs no MLX call. Temp file, fsync, rename: under its
  final name a file is whole or absent.
- Read: on the model thread, when a fetch is served better from disk
  than from memory. The whole file is read and checked (length, format,
  fingerprint, checksum, and that its tokens are the ones asked for)
  before any byte becomes KV; a file that fails is deleted and counted,
  and the request prefills as if it had missed.
- Index: tokens -> file, in memory, rebuilt at start from the files'
  headers (temp files of a crashed write are deleted); one lock guards
  it, since the worker adds files and the model thread looks them up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import threading
import time
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog
from mlx_lm.models.cache import PromptTrie

from stages.cache.tier import DiskStatistics, Key, nearest

log = structlog.get_logger(stage="gateway")

_FORMAT = "mlx-relay/kv-1"
_SUFFIX = ".safetensors"
_TOKENS = "tokens"
# safetensors data starts 8-aligned, so every tensor can be viewed in place.
_ALIGN = 8
# memoryview format -> safetensors dtype, and each dtype's item size.
_DTYPES = {"f": "F32", "e": "F16", "bfloat16": "BF16", "i": "I32"}
_ITEM_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4}
# Enough of each weight file to tell two models of the same shape apart
# without reading gigabytes at every start.
_FINGERPRINT_SAMPLE = 1 << 20
_MODEL = "disk"


@attrs.frozen
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: memoryview


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


@attrs.frozen(kw_only=True)
class SpillJob:
    tokens: Key
    prompt_len: int
    tensors: tuple[Tensor, ...]


@attrs.frozen(kw_only=True)
class Restored:
    tokens: Key
    prompt_len: int
    tensors: dict[str, Tensor]


@attrs.define
class _File:
    path: Path
    nbytes: int


@attrs.define
class DiskTier:
    root: Path
    max_bytes: int
    fingerprint: str
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Least recently used first.
    _files: OrderedDict[Key, _File] = attrs.field(factory=OrderedDict, init=False)
    _trie: PromptTrie = attrs.field(factory=PromptTrie, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    _counts: dict[str, int] = attrs.field(init=False)
    _last_restore: tuple[float, float] | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        names = ("spills", "spills_dropped", "spill_errors", "spills_unsupported", "restores", "corrupt")
        self._counts = dict.fromkeys(names, 0)

    def scan(self) -> None:
        """Index the folder's files, oldest first; delete temp and unreadable files."""
        self.root.mkdir(parents=True, exist_ok=True)
        found = []
        for path in self.root.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
            elif path.suffix == _SUFFIX:
                tokens = self._indexed_tokens(path)
                if tokens is None:
                    self._discard(path)
                else:
                    found.append((path.stat().st_mtime, tokens, path))
        with self._lock:
            for _, tokens, path in sorted(found):
                self._add(tokens, _File(path, path.stat().st_size))
            victims = self._evict_over(self.max_bytes)
        _unlink(victims)
        log.info("prompt_cache.disk_scan", root=str(self.root), entries=len(self._files), bytes=self._bytes)

    def longest(self, tokens: Sequence[int]) -> tuple[Key, int] | None:
        with self._lock:
            if not self._files:
                return None
            key, shared = nearest(self._trie, _MODEL, tokens)
        return (key, shared) if key is not None else None

    def has(self, key: Key) -> bool:
        with self._lock:
            return key in self._files

    def write(self, job: SpillJob) -> None:
        """Write one entry (the worker thread); best effort: an OSError is counted, not raised."""
        head = _header(job, self.fingerprint)
        size = len(head) + sum(t.data.nbytes for t in job.tensors)
        if self.has(job.tokens) or size > self.max_bytes:
            return
        path = self.root / (hashlib.sha256(array("i", job.tokens).tobytes()).hexdigest()[:40] + _SUFFIX)
        temp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
        try:
            with temp.open("wb") as file:
                file.write(head)
                for item in job.tensors:
                    file.write(item.data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, path)
        except OSError as error:
            # The folder itself may be gone or no longer a folder: cleaning up can fail too.
            _unlink([temp])
            self.note_error()
            log.warning("prompt_cache.spill_failed", error=type(error).__name__, path=str(path))
            return
        with self._lock:
            self._add(job.tokens, _File(path, size))
            self._counts["spills"] += 1
            victims = self._evict_over(self.max_bytes)
        _unlink(victims)

    def read(self, key: Key) -> Restored | None:
        """The entry for `key`, checked; None (and the file deleted) when it does not check out."""
        with self._lock:
            file = self._files.get(key)
        if file is None:
            return None
        try:
            data = file.path.read_bytes()
        except OSError:
            self._remove(key)
            return None
        restored = _parse(data, self.fingerprint)
        if restored is None or restored.tokens != key:
            self._remove(key)
            self._discard(file.path)
            return None
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
        # The LRU order survives a restart through mtimes; the worker may have evicted it meanwhile.
        with contextlib.suppress(OSError):
            file.path.touch()
        return restored

    def discard(self, key: Key) -> None:
        """Forget `key` and delete its file (another rank could not read its own copy)."""
        with self._lock:
            file = self._files.get(key)
        self._remove(key)
        if file is not None:
            _unlink([file.path])

    def record_restore(self, seconds: float) -> None:
        self._counts["restores"] += 1
        self._last_restore = (seconds, time.time())

    def note_dropped(self) -> None:
        self._counts["spills_dropped"] += 1

    def note_error(self) -> None:
        self._counts["spill_errors"] += 1

    def note_unsupported(self) -> None:
        self._counts["spills_unsupported"] += 1

    def statistics(self) -> DiskStatistics:
        seconds, at = self._last_restore or (None, None)
        return DiskStatistics(
            entries=len(self._files), bytes=self._bytes, max_bytes=self.max_bytes,
            last_restore_seconds=seconds, last_restore_at=at, **self._counts,
        )  # fmt: skip

    # -- index, under the lock -----------------------------------------------

    def _add(self, tokens: Key, file: _File) -> None:
        self._files[tokens] = file
        self._trie.add(_MODEL, list(tokens), file)
        self._bytes += file.nbytes

    def _evict_over(self, limit: int) -> list[Path]:
        victims = []
        while self._bytes > limit and self._files:
            tokens, file = self._files.popitem(last=False)
            self._trie.pop(_MODEL, list(tokens))
            self._bytes -= file.nbytes
            victims.append(file.path)
        return victims

    def _remove(self, key: Key) -> None:
        with self._lock:
            file = self._files.pop(key, None)
            if file is not None:
                self._trie.pop(_MODEL, list(key))
                self._bytes -= file.nbytes

    def _discard(self, path: Path) -> None:
        self._counts["corrupt"] += 1
        log.warning("prompt_cache.corrupt_file", path=str(path))
        _unlink([path])

    def _indexed_tokens(self, path: Path) -> Key | None:
        """The tokens a file holds, from its header and token tensor alone."""
        try:
            with path.open("rb") as file:
                length = int.from_bytes(file.read(8), "little")
                if length > path.stat().st_size:
                    return None
                header = json.loads(file.read(length))
                if not _ours(header, self.fingerprint):
                    return None
                start, end = header[_TOKENS]["data_offsets"]
                file.seek(8 + length + start)
                ids = array("i")
                ids.frombytes(file.read(end - start))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return tuple(ids)


def model_fingerprint(path: Path) -> str:
    """A digest of the model's config and a sample of each weight file."""
    digest = hashlib.sha256(_FORMAT.encode())
    digest.update((path / "config.json").read_bytes())
    for weights in sorted(path.glob("*" + _SUFFIX)):
        size = weights.stat().st_size
        digest.update(f"{weights.name}:{size}".encode())
        with weights.open("rb") as file:
            digest.update(file.read(_FINGERPRINT_SAMPLE))
            file.seek(max(0, size - _FINGERPRINT_SAMPLE))
            digest.update(file.read(_FINGERPRINT_SAMPLE))
    return digest.hexdigest()


def _header(job: SpillJob, fingerprint: str) -> bytes:
    entries: dict[str, Any] = {}
    offset, crc = 0, 0
    for item in job.tensors:
        entries[item.name] = {"dtype": item.dtype, "shape": list(item.shape), "data_offsets": [offset, offset + item.data.nbytes]}
        offset += item.data.nbytes
        crc = zlib.crc32(item.data, crc)
    metadata = {"format": _FORMAT, "fingerprint": fingerprint, "prompt_len": str(job.prompt_len), "crc32": str(crc)}
    text = json.dumps({"__metadata__": metadata, **entries}).encode()
    text += b" " * (-(8 + len(text)) % _ALIGN)
    return len(text).to_bytes(8, "little") + text


def _ours(header: Any, fingerprint: str) -> bool:
    metadata = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    return bool(metadata.get("format") == _FORMAT and metadata.get("fingerprint") == fingerprint)


def _parse(data: bytes, fingerprint: str) -> Restored | None:
    try:
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + length])
        if not _ours(header, fingerprint):
            return None
        body = memoryview(data)[8 + length :]
        metadata = header.pop("__metadata__")
        tensors = {name: _tensor(name, spec, body) for name, spec in header.items()}
        ends = [spec["data_offsets"][1] for spec in header.values()]
        if max(ends, default=0) != len(body) or zlib.crc32(body) != int(metadata["crc32"]):
            return None
        tokens = tensors.pop(_TOKENS)
        ids = array("i")
        ids.frombytes(tokens.data)
        return Restored(tokens=tuple(ids), prompt_len=int(metadata["prompt_len"]), tensors=tensors)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _tensor(name: str, spec: dict[str, Any], body: memoryview) -> Tensor:
    start, end = spec["data_offsets"]
    shape = tuple(int(n) for n in spec["shape"])
    if end - start != math.prod(shape) * _ITEM_BYTES[spec["dtype"]] or not 0 <= start <= end <= len(body):
        raise ValueError(f"tensor {name} does not match its shape")
    return Tensor(name, spec["dtype"], shape, body[start:end])


def _unlink(paths: Iterable[Path]) -> None:
    # Best effort: a file that cannot be removed is only space, and the next scan retries.
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
