"""Disk tier of the prompt cache: evicted entries as files, bounded in bytes.

Each entry is one safetensors file (`stages/cache/kv_file.py` writes and
checks the format). Files live in a folder per model fingerprint, so a
cache folder shared by several models never serves one model's KV to
another. Within it, each entry belongs to a space: the base model's (the
folder itself) or one LoRA adapter's (`adapters/<digest>/`, named by the
adapter's name and its weights' fingerprint), so an adapter's KV comes
back from disk for that adapter only, never for another adapter or the
base model, and retrained weights under an old name never match.

- Write: on the gateway's spill worker thread, never the model thread.
  The bytes come from memoryviews the model thread took of evaluated
  arrays, so writing needs no MLX call. Temp file, fsync, rename: under its
  final name a file is whole or absent.
- Read: on the model thread, when a fetch is served better from disk
  than from memory. The whole file is read and checked (length, format,
  fingerprint, space, checksum, and that its tokens are the ones asked
  for) before any byte becomes KV; a file that fails is deleted and
  counted, and the request prefills as if it had missed.
- Index: (space, tokens) -> file, in memory, rebuilt at start from the
  files' headers (temp files of a crashed write are deleted); one lock
  guards it, since the worker adds files and the model thread looks them up.
- Recovery: a failed write may mean the folder is gone, or was replaced
  (by a file, by another folder). The index is then rebuilt from what the
  folder holds, so `/stats` counts what is on disk, and each later write
  first checks the folder: it makes the model's folder again if that alone
  is missing (never the cache folder above it: a volume that is gone is
  not remade on another disk), rescans it once it is a folder, and writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import structlog
from mlx_lm.models.cache import PromptTrie

from stages.cache.kv_file import BASE_SPACE, SUFFIX, Restored, header, indexed, parse
from stages.cache.tier import DiskStatistics, Key, nearest
from stages.kv.shape import FULL, KvScheme
from stages.kv.tensors import Tensor

log = structlog.get_logger(stage="gateway")

_ADAPTERS = "adapters"
# A file's place in the index: its space, and its tokens.
_Slot = tuple[str, Key]


@attrs.frozen(kw_only=True)
class SpillJob:
    tokens: Key
    prompt_len: int
    tensors: tuple[Tensor, ...]
    space: str = BASE_SPACE


@attrs.define
class _File:
    path: Path
    nbytes: int


@attrs.define
class DiskTier:
    root: Path
    max_bytes: int
    fingerprint: str
    # Adapter name -> its weights' fingerprint: the adapters whose entries are filed here.
    adapters: Mapping[str, str] = attrs.field(factory=dict)
    # How the layers' KV is stored (stages/kv/shape.py): written into each file, and part of `fingerprint`.
    kv_scheme: KvScheme = FULL
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # Least recently used first.
    _files: OrderedDict[_Slot, _File] = attrs.field(factory=OrderedDict, init=False)
    _trie: PromptTrie = attrs.field(factory=PromptTrie, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    _counts: dict[str, int] = attrs.field(init=False)
    _last_restore: tuple[float, float] | None = attrs.field(default=None, init=False)
    # A write failed: the folder is checked (and the index rebuilt) before the next one.
    _suspect: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        names = ("spills", "spills_dropped", "spill_errors", "spills_unsupported", "restores", "corrupt")
        self._counts = dict.fromkeys(names, 0)

    def space_of(self, adapter: str | None) -> str | None:
        """The space an entry of `adapter` (None: the base model) is filed under; None for an adapter not listed."""
        if adapter is None:
            return BASE_SPACE
        fingerprint = self.adapters.get(adapter)
        # The fingerprint has a fixed length, so the two parts never run into each other.
        return None if fingerprint is None else f"{fingerprint}/{adapter}"

    def scan(self) -> None:
        """Index the files of every space, oldest first; delete temp and unreadable files.

        An adapter's files stay indexed while that adapter is not served: they
        serve it again once it is, and the byte cap evicts them like any other.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self._rescan()

    def _rescan(self) -> None:
        """The index, rebuilt from the files the folder holds now (none if it is not a folder)."""
        try:
            found = self._found()
        except OSError:
            found = []
        with self._lock:
            for space, tokens in self._files:
                self._trie.pop(space, list(tokens))
            self._files.clear()
            self._bytes = 0
            for _, slot, path, size in sorted(found):
                self._add(slot, _File(path, size))
            victims = self._evict_over(self.max_bytes)
        _unlink(victims)
        log.info("prompt_cache.disk_scan", root=str(self.root), entries=len(self._files), bytes=self._bytes)

    def _found(self) -> list[tuple[float, _Slot, Path, int]]:
        if not self.root.is_dir():
            return []
        adapters = self.root / _ADAPTERS
        folders = [self.root, *(sorted(p for p in adapters.iterdir() if p.is_dir()) if adapters.is_dir() else [])]
        return [item for folder in folders for item in self._scan_folder(folder)]

    def _usable(self) -> bool:
        """After a failed write: whether the folder takes writes again, the index rebuilt from it if so."""
        with contextlib.suppress(OSError):
            # One level only: the model's folder, under a cache folder that must still be there.
            self.root.mkdir(exist_ok=True)
        if not self.root.is_dir() or not os.access(self.root, os.W_OK | os.X_OK):
            return False
        self._rescan()
        self._suspect = False
        log.info("prompt_cache.disk_recovered", root=str(self.root), entries=len(self._files))
        return True

    def longest(self, tokens: Sequence[int], space: str = BASE_SPACE) -> tuple[Key, int] | None:
        with self._lock:
            if not self._files:
                return None
            key, shared = nearest(self._trie, space, tokens)
        return (key, shared) if key is not None else None

    def has(self, key: Key, space: str = BASE_SPACE) -> bool:
        with self._lock:
            return (space, key) in self._files

    def write(self, job: SpillJob) -> None:
        """Write one entry (the worker thread); best effort: an OSError is counted, not raised."""
        head = header(
            job.tensors,
            fingerprint=self.fingerprint,
            prompt_len=job.prompt_len,
            space=job.space,
            kv_scheme=self.kv_scheme.describe(),
        )
        size = len(head) + sum(t.data.nbytes for t in job.tensors)
        if self._suspect and not self._usable():
            self.note_error()
            return
        if self.has(job.tokens, job.space) or size > self.max_bytes:
            return
        path = self._folder(job.space) / (hashlib.sha256(array("i", job.tokens).tobytes()).hexdigest()[:40] + SUFFIX)
        temp = path.with_name(f".{path.stem}.{os.getpid()}.tmp")
        try:
            if job.space != BASE_SPACE:
                # Not `parents`: a root that is gone is a failed write, as for the base model's files.
                path.parent.parent.mkdir(exist_ok=True)
                path.parent.mkdir(exist_ok=True)
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
            # The files the index names may be gone with their folder: count what is there.
            self._suspect = True
            self._rescan()
            return
        with self._lock:
            self._add((job.space, job.tokens), _File(path, size))
            self._counts["spills"] += 1
            victims = self._evict_over(self.max_bytes)
        _unlink(victims)

    def read(self, key: Key, space: str = BASE_SPACE) -> Restored | None:
        """The entry for `key` in `space`, checked; None (and the file deleted) when it does not check out."""
        slot = (space, key)
        with self._lock:
            file = self._files.get(slot)
        if file is None:
            return None
        try:
            data = file.path.read_bytes()
        except OSError:
            self._remove(slot)
            return None
        restored = parse(data, self.fingerprint)
        if restored is None or restored.tokens != key or restored.space != space:
            self._remove(slot)
            self._discard(file.path)
            return None
        with self._lock:
            if slot in self._files:
                self._files.move_to_end(slot)
        # The LRU order survives a restart through mtimes; the worker may have evicted it meanwhile.
        with contextlib.suppress(OSError):
            file.path.touch()
        return restored

    def discard(self, key: Key, space: str = BASE_SPACE) -> None:
        """Forget `key` and delete its file (another rank could not read its own copy)."""
        slot = (space, key)
        with self._lock:
            file = self._files.get(slot)
        self._remove(slot)
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
            entries=len(self._files),
            bytes=self._bytes,
            max_bytes=self.max_bytes,
            last_restore_seconds=seconds,
            last_restore_at=at,
            **self._counts,
        )

    def _folder(self, space: str) -> Path:
        if space == BASE_SPACE:
            return self.root
        return self.root / _ADAPTERS / hashlib.sha256(space.encode()).hexdigest()[:16]

    def _scan_folder(self, folder: Path) -> list[tuple[float, _Slot, Path, int]]:
        """The files of one folder with their mtimes, slots and sizes; a file filed in the wrong folder is discarded."""
        found = []
        for path in folder.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
            elif path.suffix == SUFFIX:
                slot = indexed(path, self.fingerprint)
                if slot is None or self._folder(slot[0]) != folder:
                    self._discard(path)
                else:
                    status = path.stat()
                    found.append((status.st_mtime, slot, path, status.st_size))
        return found

    # -- index, under the lock -----------------------------------------------

    def _add(self, slot: _Slot, file: _File) -> None:
        self._files[slot] = file
        self._trie.add(slot[0], list(slot[1]), file)
        self._bytes += file.nbytes

    def _evict_over(self, limit: int) -> list[Path]:
        victims = []
        while self._bytes > limit and self._files:
            (space, tokens), file = self._files.popitem(last=False)
            self._trie.pop(space, list(tokens))
            self._bytes -= file.nbytes
            victims.append(file.path)
        return victims

    def _remove(self, slot: _Slot) -> None:
        with self._lock:
            file = self._files.pop(slot, None)
            if file is not None:
                self._trie.pop(slot[0], list(slot[1]))
                self._bytes -= file.nbytes

    def _discard(self, path: Path) -> None:
        self._counts["corrupt"] += 1
        log.warning("prompt_cache.corrupt_file", path=str(path))
        _unlink([path])


def _unlink(paths: Iterable[Path]) -> None:
    # Best effort: a file that cannot be removed is only space, and the next scan retries.
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
