"""The durable Responses store: one SQLite file, shared by threads and processes.

Same policy as the memory store (see `store/response_store.py`); the
records outlive the server.

Threads: one connection per store object, used only under the store's
lock (`check_same_thread=False`). A connection has one transaction at a
time, so threads sharing it unlocked would run statements inside each
other's transactions. The lock makes every operation one whole
transaction. Connections per thread would also let reads run side by
side, but anyio's worker threads come and go, and `close()` may not
close a connection that belongs to another thread.

Processes (hypercorn workers, each with its own store on the same file):
SQLite's file locks. WAL lets readers run beside the one writer. Every
transaction that writes, `get` included (it stamps last use), starts with
`BEGIN IMMEDIATE`, so it takes the write lock before it reads. A deferred
transaction that later upgrades can fail at once with SQLITE_BUSY, because
another process wrote after it read, and `busy_timeout` does not retry
that. With the lock taken up front, the timeout makes each writer wait its
turn. The sweep and the byte cap run in the insert's own transaction, so
no process ever sees the file over its cap. WAL needs shared memory
between the processes: a local disk, not a network filesystem.

Each row holds the record's JSON texts, its `size`, the time it was last
used, and `recency`, a counter across the file that gives the exact LRU
order even when two uses share a clock tick. `PRAGMA user_version` names
the schema. A newer or unknown schema, or a file that is not a database,
is refused with StoreError when the store opens; a file of schema 1 is
upgraded in place (schema 2 adds the `owner` column and the
`response_events` table of background responses' stream events).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from store.response_store import (
    UNFINISHED,
    Clock,
    EncodedResponse,
    ResponseStoreStatistics,
    StoreCounters,
    StoredEvent,
    StoredResponse,
    StoreError,
    failed,
)

SCHEMA_VERSION = 2
_EVENTS = (
    """CREATE TABLE response_events (
        response_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        frame TEXT NOT NULL,
        PRIMARY KEY (response_id, sequence)
    )""",
)
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS responses (
        id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        last_used_at REAL NOT NULL,
        recency INTEGER NOT NULL,
        size INTEGER NOT NULL,
        instructions TEXT,
        body TEXT NOT NULL,
        input_items TEXT NOT NULL,
        owner TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS responses_by_use ON responses (last_used_at)",
    "CREATE INDEX IF NOT EXISTS responses_by_recency ON responses (recency, size)",
    *_EVENTS,
)
_COLUMNS = ("id", "created_at", "last_used_at", "recency", "size", "instructions", "body", "input_items", "owner")
# Events whose response is gone (expired, evicted, replaced by an oversized record).
_ORPHANS = "DELETE FROM response_events WHERE response_id NOT IN (SELECT id FROM responses)"
_NEXT_RECENCY = "(SELECT COALESCE(MAX(recency), 0) + 1 FROM responses)"
# Opening a file that other processes are creating and writing can fail
# with SQLITE_BUSY at once, without SQLite's busy handler waiting (once in
# forty 8-process stress runs), so the whole open is retried until the
# busy timeout.
_OPEN_RETRY_SECONDS = 0.01


def _absolute(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.abspath(path))


@attrs.define
class SqliteResponseStore:
    """Opens (creating the file, its folder and the schema) on construction.

    Raises:
        StoreError: the folder cannot be made, or the file is not a
            database, or holds a newer or unknown schema.
    """

    _path: Path = attrs.field(converter=_absolute, alias="path")
    _ttl: float = attrs.field(alias="ttl_seconds")
    _max_bytes: int = attrs.field(alias="max_bytes")
    _clock: Clock = attrs.field(default=time.time, alias="clock")
    # Seconds a writer waits for another thread's or process's transaction.
    _busy_timeout: float = attrs.field(default=5.0, alias="busy_timeout")
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _db: sqlite3.Connection | None = attrs.field(default=None, init=False)
    _counts: StoreCounters = attrs.field(init=False)

    @_counts.default
    def _within_limits(self) -> StoreCounters:
        return StoreCounters(ttl_seconds=self._ttl, max_bytes=self._max_bytes)

    def __attrs_post_init__(self) -> None:
        deadline = time.monotonic() + self._busy_timeout
        with self._failures("open"), self._lock:
            while True:
                try:
                    self._db = _open(self._path, self._busy_timeout)
                    return
                except sqlite3.OperationalError as exc:
                    if not _busy(exc) or time.monotonic() >= deadline:
                        raise
                time.sleep(_OPEN_RETRY_SECONDS)

    def put(self, record: StoredResponse) -> None:
        encoded = EncodedResponse.encode(record)
        with self._failures("put"), self._lock:
            with self._transaction() as db:
                now = self._clock()
                expired = db.execute("DELETE FROM responses WHERE last_used_at <= ?", (now - self._ttl,)).rowcount
                db.execute("DELETE FROM responses WHERE id = ?", (encoded.id,))
                oversized = encoded.size > self._max_bytes
                evicted = 0 if oversized else self._insert(db, encoded, now)
                if expired or evicted or oversized:
                    db.execute(_ORPHANS)
            self._counts.stored(expired=expired, evicted=evicted, oversized=oversized)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._failures("get"), self._lock:
            with self._transaction() as db:
                now = self._clock()
                row = db.execute(
                    f"SELECT {', '.join(_COLUMNS)}, last_used_at <= ? FROM responses WHERE id = ?",
                    (now - self._ttl, response_id),
                ).fetchone()
                expired = row is not None and bool(row[-1])
                if expired:
                    db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
                    db.execute("DELETE FROM response_events WHERE response_id = ?", (response_id,))
                elif row is not None:
                    db.execute(
                        f"UPDATE responses SET last_used_at = ?, recency = {_NEXT_RECENCY} WHERE id = ?",
                        (now, response_id),
                    )
            found = row is not None and not expired
            self._counts.lookup(found=found, expired=expired)
        # Decoded outside the lock: it is CPU work on this thread's own copy.
        return _encoded(row[:-1]).decode() if found else None

    def delete(self, response_id: str) -> bool:
        with self._failures("delete"), self._lock, self._transaction() as db:
            live = db.execute(
                "SELECT 1 FROM responses WHERE id = ? AND last_used_at > ?", (response_id, self._clock() - self._ttl)
            ).fetchone()
            db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            db.execute("DELETE FROM response_events WHERE response_id = ?", (response_id,))
            return live is not None

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> None:
        with self._failures("add_events"), self._lock, self._transaction() as db:
            # Only for a stored response: events never outlive their record.
            if db.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone() is not None:
                rows = [(response_id, sequence, frame) for sequence, frame in events]
                db.executemany("INSERT OR REPLACE INTO response_events VALUES (?, ?, ?)", rows)

    def events_after(self, response_id: str, after: int) -> list[StoredEvent]:
        with self._failures("events_after"), self._lock:
            rows = self._connection().execute(
                "SELECT sequence, frame FROM response_events WHERE response_id = ? AND sequence > ? ORDER BY sequence",
                (response_id, after),
            )
            return [(int(sequence), str(frame)) for sequence, frame in rows]

    def fail_unfinished(self, message: str) -> int:
        with self._failures("fail_unfinished"), self._lock, self._transaction() as db:
            marks = ", ".join("?" * len(UNFINISHED))
            rows = db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM responses WHERE json_extract(body, '$.status') IN ({marks})",
                UNFINISHED,
            ).fetchall()
            for row in rows:
                encoded = EncodedResponse.encode(failed(_encoded(row).decode(), message))
                db.execute(
                    "UPDATE responses SET body = ?, size = ? WHERE id = ?", (encoded.body, encoded.size, encoded.id)
                )
            return len(rows)

    def statistics(self) -> ResponseStoreStatistics:
        with self._failures("statistics"), self._lock:
            entries, size = self._connection().execute("SELECT COUNT(*), TOTAL(size) FROM responses").fetchone()
        return self._counts.statistics(kind="sqlite", location=str(self._path), entries=int(entries), size=int(size))

    def close(self) -> None:
        with self._failures("close"), self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _insert(self, db: sqlite3.Connection, encoded: EncodedResponse, now: float) -> int:
        db.execute(
            f"INSERT INTO responses ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, {_NEXT_RECENCY}, ?, ?, ?, ?, ?)",
            (
                encoded.id,
                encoded.created_at,
                now,
                encoded.size,
                encoded.instructions,
                encoded.body,
                encoded.input_items,
                encoded.owner,
            ),
        )
        return self._evict(db, keep=encoded.id)

    def _evict(self, db: sqlite3.Connection, *, keep: str) -> int:
        """Deletes least recently used rows until the cap holds; returns how many."""
        (total,) = db.execute("SELECT TOTAL(size) FROM responses").fetchone()
        victims: list[tuple[str]] = []
        if total > self._max_bytes:
            for response_id, size in db.execute(
                "SELECT id, size FROM responses WHERE id != ? ORDER BY recency", (keep,)
            ):
                if total <= self._max_bytes:
                    break
                victims.append((response_id,))
                total -= size
        db.executemany("DELETE FROM responses WHERE id = ?", victims)
        return len(victims)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError(f"the response store {self._path} is closed")
        return self._db

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; the caller holds the lock."""
        db = self._connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.rollback()
            raise

    @contextlib.contextmanager
    def _failures(self, action: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"response store {self._path}: {action} failed: {exc}") from exc


def _open(path: Path, busy_timeout: float) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: no implicit transactions; each method says BEGIN IMMEDIATE itself.
    db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        # In WAL mode NORMAL survives any process crash; a power cut may lose
        # the last commits but never corrupts the file.
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("BEGIN IMMEDIATE")
        _migrate(db, path)
        db.execute("COMMIT")
    except BaseException:
        db.close()  # and with it any open transaction
        raise
    return db


def _busy(exc: sqlite3.OperationalError) -> bool:
    return exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Creates the schema in an empty file; refuses anything it does not know."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path} holds response store schema {version}, newer than this server's {SCHEMA_VERSION}")
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version == 0 and not tables:
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    columns = tuple(str(row[1]) for row in db.execute("PRAGMA table_info(responses)"))
    if version == 1 and columns == _COLUMNS[:-1]:
        # Schema 1 lacks what background responses keep; adding it loses nothing.
        db.execute("ALTER TABLE responses ADD COLUMN owner TEXT")
        for statement in _EVENTS:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        return
    if version != SCHEMA_VERSION or columns != _COLUMNS:
        raise StoreError(
            f"{path} is not a response store this server knows (schema {version}, tables {sorted(tables)})"
        )


def _encoded(row: tuple[object, ...]) -> EncodedResponse:
    response_id, created_at, _, _, size, instructions, body, input_items, owner = row
    if not (
        isinstance(response_id, str)
        and isinstance(created_at, (int, float))
        and isinstance(size, int)
        and (instructions is None or isinstance(instructions, str))
        and isinstance(body, str)
        and isinstance(input_items, str)
        and (owner is None or isinstance(owner, str))
    ):
        raise StoreError(f"stored response {response_id!r} is corrupt: a column has the wrong type")
    return EncodedResponse(
        id=response_id,
        created_at=float(created_at),
        instructions=instructions,
        body=body,
        input_items=input_items,
        size=size,
        owner=owner,
    )
