"""Uploaded files and batch results on disk, under one folder (docs/apis.md, "Files and batches").

Each file is `<id>.data` with its facts beside it in `<id>.json`; the facts are written last, by rename,
so a file a crash cut short is never listed. Uploads are bounded by a byte cap each and a count cap in all;
a batch's result files are adopted past the count cap, since a finished batch must not lose its results.
Synchronous and thread-safe: routes call it through `anyio.to_thread`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import attrs

from pipeline.requests import JsonObject


class FileLimitError(Exception):
    """An upload past the store's byte or count cap; the message says which."""


@attrs.frozen(kw_only=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    # A digest of the key that uploaded it, None when the server has no keys.
    owner: str | None

    def facts(self) -> JsonObject:
        return {name: getattr(self, name) for name in ("id", "filename", "purpose", "bytes", "created_at", "owner")}


@attrs.define
class FileStore:
    folder: Path
    max_bytes: int
    max_count: int
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def add(self, *, filename: str, purpose: str, data: bytes, owner: str | None) -> StoredFile:
        """Store an upload. Raises: FileLimitError past the byte or count cap."""
        if len(data) > self.max_bytes:
            raise FileLimitError(f"The file is larger than this server's limit of {self.max_bytes} bytes")
        with self._lock:
            if len(self._facts_paths()) >= self.max_count:
                raise FileLimitError(f"This server holds at most {self.max_count} files; delete some first")
            file_id = _new_id()
            write_whole(self._data(file_id), data)
            return self._record(file_id, filename, purpose, len(data), owner)

    def adopt(self, source: Path, *, filename: str, purpose: str, owner: str | None) -> StoredFile:
        """Move a finished file (a batch's results) in as a new file, outside the count cap."""
        with self._lock:
            file_id = _new_id()
            os.replace(source, self._data(file_id))
            return self._record(file_id, filename, purpose, self._data(file_id).stat().st_size, owner)

    def get(self, file_id: str) -> StoredFile | None:
        path = self._facts(file_id)
        if not _safe(file_id) or not path.exists():
            return None
        return StoredFile(**json.loads(path.read_text()))

    def content(self, file_id: str) -> bytes:
        return self._data(file_id).read_bytes()

    def listed(self) -> list[StoredFile]:
        """Every file, newest first."""
        found = [self.get(path.stem) for path in self._facts_paths()]
        return sorted((file for file in found if file is not None), key=lambda file: (-file.created_at, file.id))

    def delete(self, file_id: str) -> bool:
        with self._lock:
            if self.get(file_id) is None:
                return False
            self._facts(file_id).unlink()
            self._data(file_id).unlink(missing_ok=True)
            return True

    def _record(self, file_id: str, filename: str, purpose: str, size: int, owner: str | None) -> StoredFile:
        stored = StoredFile(
            id=file_id, filename=filename, purpose=purpose, bytes=size, created_at=int(time.time()), owner=owner
        )
        write_whole(self._facts(file_id), json.dumps(stored.facts()).encode())
        return stored

    def _facts_paths(self) -> list[Path]:
        return list(self.folder.glob("file-*.json"))

    def _facts(self, file_id: str) -> Path:
        return self.folder / f"{file_id}.json"

    def _data(self, file_id: str) -> Path:
        return self.folder / f"{file_id}.data"


def _new_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def _safe(file_id: str) -> bool:
    # An id from a URL names a file in this folder only.
    return file_id.startswith("file-") and file_id[5:].isalnum()


def write_whole(path: Path, data: bytes) -> None:
    """Whole or not at all: a crash leaves the old file or none, never half of the new one."""
    # Named apart, so two writers of one file (a route and the runner) never share a partial one.
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.partial")
    with partial.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
