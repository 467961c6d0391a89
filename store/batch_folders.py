"""Batches on disk: each batch a folder of its facts, its input lines and its results as they finish.

`<id>/batch.json` holds the facts (status, times, counts), replaced whole by rename; `input.jsonl` the
lines as created; `output.jsonl` and `errors.jsonl` grow by one appended, fsynced line per finished
request. A restart reads the results back: the custom ids in them are done and never run again, and a
line a crash cut short is dropped, so its request runs again (docs/apis.md, "Files and batches").
Synchronous and thread-safe: the runner and the routes call it through `anyio.to_thread`.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import attrs

from pipeline.requests import JsonObject
from store.files import write_whole

OUTPUT = "output.jsonl"
ERRORS = "errors.jsonl"
# Statuses after which nothing runs.
ENDED = frozenset({"completed", "failed", "expired", "cancelled"})


@attrs.frozen(kw_only=True)
class BatchRecord:
    id: str
    # "openai" (`/v1/batches`) or "anthropic" (`/v1/messages/batches`): which API shows it.
    api: str
    endpoint: str
    input_file_id: str
    metadata: dict[str, str] | None
    owner: str | None
    status: str
    created_at: int
    expires_at: int
    total: int
    completed: int = 0
    failed: int = 0
    # Lines that never ran because the window closed (counted in `failed` too, as OpenAI does).
    expired: int = 0
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None

    def facts(self) -> JsonObject:
        return attrs.asdict(self)


@attrs.define
class BatchStore:
    folder: Path
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __attrs_post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def create(self, record: BatchRecord, lines: list[JsonObject]) -> None:
        home = self._home(record.id)
        home.mkdir()
        write_whole(home / "input.jsonl", b"".join(_jsonl(line) for line in lines))
        self.save(record)

    def save(self, record: BatchRecord) -> None:
        with self._lock:
            write_whole(self._home(record.id) / "batch.json", json.dumps(record.facts()).encode())

    def get(self, batch_id: str) -> BatchRecord | None:
        path = self._home(batch_id) / "batch.json"
        if not batch_id.replace("_", "").isalnum() or not path.exists():
            return None
        return BatchRecord(**json.loads(path.read_text()))

    def listed(self) -> list[BatchRecord]:
        """Every batch, newest first."""
        found = [self.get(path.parent.name) for path in self.folder.glob("*/batch.json")]
        return sorted((batch for batch in found if batch is not None), key=lambda batch: (-batch.created_at, batch.id))

    def delete(self, batch_id: str) -> None:
        shutil.rmtree(self._home(batch_id), ignore_errors=True)

    def input_lines(self, batch_id: str) -> list[JsonObject]:
        text = (self._home(batch_id) / "input.jsonl").read_bytes()
        return [json.loads(raw) for raw in text.splitlines() if raw.strip()]

    def append(self, batch_id: str, name: str, line: JsonObject) -> None:
        """Add one finished request's line to `name` (OUTPUT or ERRORS), on disk before this returns."""
        with self._lock, (self._home(batch_id) / name).open("ab") as out:
            out.write(_jsonl(line))
            out.flush()
            os.fsync(out.fileno())

    def results(self, batch_id: str, name: str) -> list[JsonObject]:
        """The whole lines of `name`; a last line a crash cut short is cut off the file."""
        path = self._home(batch_id) / name
        if not path.exists():
            return []
        with self._lock:
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if len(whole) != len(data):
                with path.open("r+b") as out:
                    out.truncate(len(whole))
        return [json.loads(raw) for raw in whole.splitlines()]

    def result_path(self, batch_id: str, name: str) -> Path:
        return self._home(batch_id) / name

    def _home(self, batch_id: str) -> Path:
        return self.folder / batch_id


def _jsonl(line: JsonObject) -> bytes:
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"
