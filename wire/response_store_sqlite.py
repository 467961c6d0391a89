"""The durable Responses store: one SQLite file, safe across threads and processes.

Each thread has its own connection; WAL mode lets readers run beside the
one writer, and `busy_timeout` makes concurrent writers (other threads,
other hypercorn workers) wait their turn instead of failing. Expiry and
the byte cap are applied inside the same transaction as each insert, so
no reader sees the store over its bound. `user_version` records the
schema; an unknown one is refused rather than misread.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs

from wire.response_store import Clock, ResponseStoreStatistics, StoredResponse, StoreError, decode, encode

T = TypeVar("T")

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    last_used_at REAL NOT NULL,
    size INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_use ON responses (last_used_at);
"""
_BUSY_TIMEOUT_MS = 10_000


@attrs.define
class SqliteResponseStore:
    _path: Path = attrs.field(converter=Path, alias="path")
    _ttl: float = attrs.field(alias="ttl_seconds")
    _max_bytes: int = attrs.field(alias="max_bytes")
    _clock: Clock = attrs.field(default=time.time, alias="clock")
    _local: threading.local = attrs.field(factory=threading.local, init=False)
    _connections: list[sqlite3.Connection] = attrs.field(factory=list, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _hits: int = attrs.field(default=0, init=False)
    _misses: int = attrs.field(default=0, init=False)
    _evictions: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(f"cannot create {self._path.parent}: {error}") from None
        self._run(self._create_schema)

    def put(self, record: StoredResponse) -> None:
        text = encode(record)
        self._run(lambda db: self._insert(db, record, text))

    def get(self, response_id: str) -> StoredResponse | None:
        row = self._run(lambda db: self._touch(db, response_id))
        with self._lock:
            if row is None:
                self._misses += 1
            else:
                self._hits += 1
        return None if row is None else decode(row)

    def delete(self, response_id: str) -> bool:
        def delete(db: sqlite3.Connection) -> bool:
            with db:
                live = db.execute(
                    "SELECT 1 FROM responses WHERE id = ? AND created_at >= ?", (response_id, self._oldest())
                ).fetchone()
                db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            return live is not None

        return self._run(delete)

    def statistics(self) -> ResponseStoreStatistics:
        entries, size = self._run(lambda db: db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone())
        with self._lock:
            return ResponseStoreStatistics(
                kind="sqlite",
                entries=int(entries),
                bytes=int(size),
                max_bytes=self._max_bytes,
                ttl_seconds=self._ttl,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
            )

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()
        self._local = threading.local()

    def _create_schema(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, _SCHEMA_VERSION):
            raise StoreError(f"{self._path} has response store schema {version}; this server knows {_SCHEMA_VERSION}")
        with db:
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")

    def _insert(self, db: sqlite3.Connection, record: StoredResponse, text: str) -> None:
        size, now = len(text.encode()), self._clock()
        if size > self._max_bytes:
            with self._lock:
                self._evictions += 1
            return
        with db:
            db.execute("DELETE FROM responses WHERE created_at < ?", (self._oldest(),))
            db.execute(
                "INSERT OR REPLACE INTO responses (id, created_at, last_used_at, size, record) VALUES (?, ?, ?, ?, ?)",
                (record.id, now, now, size, text),
            )
            evicted = self._evict(db)
        with self._lock:
            self._evictions += evicted

    def _evict(self, db: sqlite3.Connection) -> int:
        (total,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()
        evicted = 0
        # Least recently used first, until the cap holds again.
        for response_id, size in db.execute("SELECT id, size FROM responses ORDER BY last_used_at").fetchall():
            if total <= self._max_bytes:
                break
            db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            total, evicted = total - size, evicted + 1
        return evicted

    def _touch(self, db: sqlite3.Connection, response_id: str) -> str | None:
        with db:
            row = db.execute(
                "SELECT record FROM responses WHERE id = ? AND created_at >= ?", (response_id, self._oldest())
            ).fetchone()
            if row is not None:
                db.execute("UPDATE responses SET last_used_at = ? WHERE id = ?", (self._clock(), response_id))
        return None if row is None else str(row[0])

    def _oldest(self) -> float:
        return self._clock() - self._ttl

    def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return operation(self._connection())
        except sqlite3.Error as error:
            raise StoreError(f"response store {self._path}: {error}") from None

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self._path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level="DEFERRED")
            connection.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            connection.execute("PRAGMA journal_mode = WAL")
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection
