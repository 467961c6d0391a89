"""The shared Responses store: one PostgreSQL database, for replicas on several hosts.

Same policy as the memory and SQLite stores (see `store/response_store.py`),
so a `previous_response_id` resolves on whichever replica a router picks.
SQLite's WAL needs shared memory between its processes, so it serves one
host only; this store is for more than one.

Connections: a small `psycopg_pool` pool (`POOL_SIZE`), one connection per
call, each call one transaction, so the store is thread-safe without a
lock of its own. Writers across every replica are serialised by a
transaction-scoped advisory lock (`_WRITE_LOCK`): the sweep, the insert
and the byte-cap eviction run inside one `put`, so no replica ever sees
the table over its cap, as with SQLite's `BEGIN IMMEDIATE`. A `get`
stamps its row's use without that lock (row locks suffice: it changes no
sizes). The LRU order is `recency`, drawn from a sequence, exact across
replicas; the TTL runs on each replica's clock, as with SQLite across
processes (replicas' clocks should agree to well within the TTL).

The schema's version is the one row of `mlx_relay_response_store`; a
newer or unknown schema is refused with StoreError when the store opens,
and creating it is done under the advisory lock, so replicas starting
together make it once. Schema 1 is upgraded in place to 2 (the `owner`
column and the table of background responses' stream events). The `psycopg` package is the `postgres` extra.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

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

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

SCHEMA_VERSION = 2
# Connections per replica: a store call is one short transaction.
POOL_SIZE = 4
# Seconds start-up waits for the database where the URL names no `connect_timeout`.
DEFAULT_CONNECT_TIMEOUT = 10.0
_TABLE = "mlx_relay_responses"
_META = "mlx_relay_response_store"
# Any fixed 64-bit key: the advisory lock every writer takes.
_WRITE_LOCK = 0x6D6C7872656C6179
_EVENTS_TABLE = "mlx_relay_response_events"
_EVENTS = (
    f"""CREATE TABLE {_EVENTS_TABLE} (
        response_id TEXT NOT NULL,
        sequence BIGINT NOT NULL,
        frame TEXT NOT NULL,
        PRIMARY KEY (response_id, sequence)
    )""",
)
_SCHEMA = (
    f"""CREATE TABLE {_TABLE} (
        id TEXT PRIMARY KEY,
        created_at DOUBLE PRECISION NOT NULL,
        last_used_at DOUBLE PRECISION NOT NULL,
        recency BIGINT NOT NULL,
        size BIGINT NOT NULL,
        instructions TEXT,
        body TEXT NOT NULL,
        input_items TEXT NOT NULL,
        owner TEXT
    )""",
    *_EVENTS,
    f"CREATE INDEX {_TABLE}_by_use ON {_TABLE} (last_used_at)",
    f"CREATE INDEX {_TABLE}_by_recency ON {_TABLE} (recency)",
    f"CREATE SEQUENCE {_TABLE}_recency",
    f"INSERT INTO {_META} (version) VALUES ({SCHEMA_VERSION})",
)
_COLUMNS = ("id", "created_at", "last_used_at", "recency", "size", "instructions", "body", "input_items", "owner")
_READ = "id, created_at, size, instructions, body, input_items, owner"
# Events whose response is gone (expired, evicted, replaced by an oversized record).
_ORPHANS = f"DELETE FROM {_EVENTS_TABLE} WHERE response_id NOT IN (SELECT id FROM {_TABLE})"
_NEXT_RECENCY = f"nextval('{_TABLE}_recency')"


def is_postgres_url(url: str | None) -> bool:
    return urlsplit((url or "").strip()).scheme.lower() in ("postgresql", "postgres")


def connect_timeout_of(url: str) -> float:
    """How long start-up waits for the database: the URL's own `connect_timeout` (libpq's parameter, seconds;
    0 or none given: `DEFAULT_CONNECT_TIMEOUT`). The pool retries a refused connection until then, so a
    database still starting is waited for, and one that is not there fails start-up only after it."""
    given = parse_qs(urlsplit(url).query).get("connect_timeout", [""])[-1]
    try:
        seconds = float(given)
    except ValueError:
        return DEFAULT_CONNECT_TIMEOUT
    return seconds if seconds > 0 else DEFAULT_CONNECT_TIMEOUT


def redacted(url: str) -> str:
    """The URL without its password, for /stats and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@attrs.define
class PostgresResponseStore:
    """Connects, and creates the schema if the database has none, on construction.

    Raises:
        StoreError: psycopg is not installed, the server cannot be reached
            within `connect_timeout`, or the database holds a newer or
            unknown schema.
    """

    _url: str = attrs.field(alias="url")
    _ttl: float = attrs.field(alias="ttl_seconds")
    _max_bytes: int = attrs.field(alias="max_bytes")
    _clock: Clock = attrs.field(default=time.time, alias="clock")
    # Start-up's wait for the database: the URL's own `connect_timeout` unless given (`connect_timeout_of`).
    _connect_timeout: float = attrs.field(alias="connect_timeout")
    _pool: ConnectionPool[Any] | None = attrs.field(default=None, init=False)
    # The counts lock themselves: the database's own locks order everything else.
    _counts: StoreCounters = attrs.field(init=False)

    @_connect_timeout.default
    def _urls_connect_timeout(self) -> float:
        return connect_timeout_of(self._url)

    @_counts.default
    def _within_limits(self) -> StoreCounters:
        return StoreCounters(ttl_seconds=self._ttl, max_bytes=self._max_bytes)

    def __attrs_post_init__(self) -> None:
        try:
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise StoreError(
                "a postgresql:// response store needs psycopg: pip install 'mlx-relay[postgres]'"
            ) from None
        with self._failures("open"):
            pool: ConnectionPool[Any] = ConnectionPool(
                self._url,
                min_size=1,
                max_size=POOL_SIZE,
                open=False,
                timeout=self._connect_timeout,
                name="mlx-relay-responses",
                kwargs={"connect_timeout": max(1, round(self._connect_timeout))},
            )
            try:
                pool.open(wait=True, timeout=self._connect_timeout)
                self._pool = pool
                with self._transaction() as db:
                    _migrate(db, redacted(self._url))
            except BaseException:
                pool.close()
                self._pool = None
                raise

    def put(self, record: StoredResponse) -> None:
        encoded = EncodedResponse.encode(record)
        with self._failures("put"), self._transaction() as db:
            now = self._clock()
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            expired = db.execute(f"DELETE FROM {_TABLE} WHERE last_used_at <= %s", (now - self._ttl,)).rowcount
            db.execute(f"DELETE FROM {_TABLE} WHERE id = %s", (encoded.id,))
            oversized = encoded.size > self._max_bytes
            evicted = 0 if oversized else self._insert(db, encoded, now)
            if expired or evicted or oversized:
                db.execute(_ORPHANS)
        self._counts.stored(expired=expired, evicted=evicted, oversized=oversized)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._failures("get"), self._transaction() as db:
            now = self._clock()
            expired = db.execute(
                f"DELETE FROM {_TABLE} WHERE id = %s AND last_used_at <= %s", (response_id, now - self._ttl)
            ).rowcount
            if expired:
                db.execute(f"DELETE FROM {_EVENTS_TABLE} WHERE response_id = %s", (response_id,))
            row = db.execute(
                f"UPDATE {_TABLE} SET last_used_at = %s, recency = {_NEXT_RECENCY} WHERE id = %s RETURNING {_READ}",
                (now, response_id),
            ).fetchone()
        self._counts.lookup(found=row is not None, expired=expired)
        return _encoded(row).decode() if row is not None else None

    def delete(self, response_id: str) -> bool:
        with self._failures("delete"), self._transaction() as db:
            row = db.execute(
                f"DELETE FROM {_TABLE} WHERE id = %s RETURNING last_used_at > %s",
                (response_id, self._clock() - self._ttl),
            ).fetchone()
            db.execute(f"DELETE FROM {_EVENTS_TABLE} WHERE response_id = %s", (response_id,))
        return row is not None and bool(row[0])

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> None:
        rows = [(response_id, sequence, frame, response_id) for sequence, frame in events]
        with self._failures("add_events"), self._transaction() as db, db.cursor() as cursor:
            # Only for a stored response: events never outlive their record.
            cursor.executemany(
                f"""INSERT INTO {_EVENTS_TABLE} SELECT %s, %s, %s WHERE EXISTS (SELECT 1 FROM {_TABLE} WHERE id = %s)
                ON CONFLICT (response_id, sequence) DO UPDATE SET frame = EXCLUDED.frame""",
                rows,
            )

    def events_after(self, response_id: str, after: int) -> list[StoredEvent]:
        with self._failures("events_after"), self._transaction() as db:
            rows = db.execute(
                f"SELECT sequence, frame FROM {_EVENTS_TABLE} WHERE response_id = %s AND sequence > %s "
                "ORDER BY sequence",
                (response_id, after),
            ).fetchall()
        return [(int(sequence), str(frame)) for sequence, frame in rows]

    def fail_unfinished(self, message: str) -> int:
        with self._failures("fail_unfinished"), self._transaction() as db:
            db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            rows = db.execute(
                f"SELECT {_READ} FROM {_TABLE} WHERE (body::jsonb ->> 'status') = ANY(%s)", (list(UNFINISHED),)
            ).fetchall()
            for row in rows:
                encoded = EncodedResponse.encode(failed(_encoded(row).decode(), message))
                db.execute(
                    f"UPDATE {_TABLE} SET body = %s, size = %s WHERE id = %s", (encoded.body, encoded.size, encoded.id)
                )
        return len(rows)

    def statistics(self) -> ResponseStoreStatistics:
        with self._failures("statistics"), self._transaction() as db:
            entries, size = db.execute(f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM {_TABLE}").fetchone() or (0, 0)
        where = redacted(self._url)
        return self._counts.statistics(kind="postgresql", location=where, entries=int(entries), size=int(size))

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _insert(self, db: Connection[Any], encoded: EncodedResponse, now: float) -> int:
        db.execute(
            f"INSERT INTO {_TABLE} ({', '.join(_COLUMNS)}) VALUES (%s, %s, %s, {_NEXT_RECENCY}, %s, %s, %s, %s, %s)",
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
        # The least recently used go first until the rest fit: the newest rows whose running total fits stay.
        return db.execute(
            f"""DELETE FROM {_TABLE} WHERE id IN (
                SELECT id FROM (SELECT id, SUM(size) OVER (ORDER BY recency DESC) AS newer FROM {_TABLE}) AS ranked
                WHERE newer > %s)""",
            (self._max_bytes,),
        ).rowcount

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection[Any]]:
        """One connection from the pool, one transaction: committed on success, rolled back on any error."""
        if self._pool is None:
            raise StoreError(f"the response store {redacted(self._url)} is closed")
        with self._pool.connection() as db, db.transaction():
            yield db

    @contextlib.contextmanager
    def _failures(self, action: str) -> Iterator[None]:
        import psycopg

        try:
            yield
        except (psycopg.Error, OSError) as exc:
            raise StoreError(f"response store {redacted(self._url)}: {action} failed: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _migrate(db: Connection[Any], where: str) -> None:
    """Creates the schema in a database without one; refuses anything it does not know."""
    db.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
    db.execute(f"CREATE TABLE IF NOT EXISTS {_META} (version INTEGER NOT NULL)")
    versions = [int(version) for (version,) in db.execute(f"SELECT version FROM {_META}").fetchall()]
    if not versions:
        for statement in _SCHEMA:
            db.execute(statement)
        return
    if len(versions) != 1 or versions[0] not in (1, SCHEMA_VERSION):
        newer = len(versions) == 1 and versions[0] > SCHEMA_VERSION
        detail = f"newer than this server's {SCHEMA_VERSION}" if newer else "not one this server knows"
        raise StoreError(f"{where} holds response store schema {versions}, {detail}")
    columns = tuple(
        str(name)
        for (name,) in db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
            (_TABLE,),
        ).fetchall()
    )
    if versions[0] == 1 and columns == _COLUMNS[:-1]:
        # Schema 1 lacks what background responses keep; adding it loses nothing.
        for statement in (f"ALTER TABLE {_TABLE} ADD COLUMN owner TEXT", *_EVENTS, f"UPDATE {_META} SET version = 2"):
            db.execute(statement)
        return
    if columns != _COLUMNS:
        raise StoreError(
            f"{where} is not a response store this server knows (table {_TABLE} has columns {list(columns)})"
        )


def _encoded(row: tuple[Any, ...]) -> EncodedResponse:
    response_id, created_at, size, instructions, body, input_items, owner = row
    return EncodedResponse(
        id=str(response_id),
        created_at=float(created_at),
        instructions=instructions,
        body=body,
        input_items=input_items,
        size=int(size),
        owner=owner,
    )
