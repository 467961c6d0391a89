"""The Responses API store: `previous_response_id` and `GET/DELETE /v1/responses/{id}`.

One small synchronous interface, `ResponseStore`, with three stores behind
it: `MemoryResponseStore` (the default), `SqliteResponseStore` in
`store/sqlite.py`, which survives a restart and is shared by
the processes of one host, and `PostgresResponseStore` in
`store/postgres.py`, shared by replicas on several hosts. `open_store`
picks one from the `MLX_RELAY_RESPONSE_STORE` URL (`store/opening.py`). The app calls a store
through `anyio.to_thread.run_sync`, so every store is thread-safe, and
every failure inside one is a `StoreError`, which fails that one request.

Every store keeps the same policy, so one test table covers them all
(and one `StoreCounters` holds each store's limits and `/stats` counts):

- A record lives `ttl_seconds` after it was last stored or read: `get`
  refreshes it, as it refreshes its place in the LRU order. Expired
  records are dropped when read and swept when something is stored.
- A record's size is `EncodedResponse.size`, the UTF-8 length of its JSON.
  When the sizes pass `max_bytes`, the least recently used go first.
- A record larger than `max_bytes` on its own is not stored, and is
  counted in `oversized`: keeping it would evict everything else and
  still break the cap. Any older record under its id is removed, so `get`
  never answers with stale data. A follow-up then sees an unknown id, as
  it would after an eviction; the response already sent is unaffected.
- `get` returns a fresh copy decoded from JSON, so a caller that mutates
  it changes nothing stored, in memory as on disk.
- A background response's stream events (`add_events`, `events_after`)
  live exactly as long as its record: storing the record again keeps
  them, and whatever drops the record (TTL, byte cap, `delete`) drops
  them. They are not counted in `max_bytes`: they are at most one
  response's stream, and kept only for background responses.
- `fail_unfinished` marks every record still `queued` or `in_progress`
  `failed` with a reason: what a server starting up calls, since no
  process that ran them is left (docs/apis.md, "Background responses").
"""

from __future__ import annotations

import collections
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

import attrs

from pipeline.requests import JsonObject

Clock = Callable[[], float]
# One stream event of a background response: its `sequence_number` and its SSE frame as text.
StoredEvent = tuple[int, str]
# The statuses of a response whose work has not ended.
UNFINISHED = ("queued", "in_progress")


class StoreError(Exception):
    """A store failed (I/O, SQLite, corrupt data) or was given a bad setting."""


@attrs.frozen(kw_only=True)
class StoredResponse:
    id: str
    # Unix seconds, as in the response body; the TTL runs on the store's own clock.
    created_at: float
    # The full Responses API response object as returned to the client.
    body: JsonObject
    # Every input item that produced it, spliced history included: what a
    # follow-up replays before its own input.
    input_items: tuple[JsonObject, ...]
    # Carried forward when a follow-up omits them.
    instructions: str | None
    # A fingerprint of the API key that made it (edge/guard.py's `caller`); None without keys.
    owner: str | None = None


@attrs.frozen(kw_only=True)
class ResponseStoreStatistics:
    """The `/stats` figures. For SQLite and PostgreSQL, entries and bytes are the
    database's (every process's); hits through oversized count this store object's calls."""

    kind: Literal["memory", "sqlite", "postgresql"]
    location: str | None  # the database file, or its URL without the password; None in memory
    entries: int
    bytes: int
    max_bytes: int
    ttl_seconds: float
    hits: int
    misses: int  # unknown and expired ids alike
    evictions: int  # dropped for the byte cap
    expirations: int  # dropped for the TTL
    oversized: int  # records refused for being over max_bytes alone


class ResponseStore(Protocol):
    def put(self, record: StoredResponse) -> None: ...

    def get(self, response_id: str) -> StoredResponse | None: ...

    def delete(self, response_id: str) -> bool: ...

    def statistics(self) -> ResponseStoreStatistics: ...

    def close(self) -> None: ...

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> None: ...

    def events_after(self, response_id: str, after: int) -> list[StoredEvent]: ...

    def fail_unfinished(self, message: str) -> int: ...


@attrs.frozen(kw_only=True)
class EncodedResponse:
    """A record as JSON text: what both stores hold, and what `size` measures."""

    id: str
    created_at: float
    instructions: str | None
    body: str
    input_items: str
    size: int
    owner: str | None = None

    @classmethod
    def encode(cls, record: StoredResponse) -> EncodedResponse:
        """Raises StoreError when the record holds something JSON cannot encode."""
        try:
            body = _dumps(record.body)
            items = _dumps(list(record.input_items))
        except (TypeError, ValueError) as exc:
            raise StoreError(f"response {record.id!r} cannot be stored as JSON: {exc}") from exc
        texts = (record.id, body, items, record.instructions or "")
        size = sum(len(text.encode()) for text in texts)
        return cls(
            id=record.id,
            created_at=record.created_at,
            instructions=record.instructions,
            body=body,
            input_items=items,
            size=size,
            owner=record.owner,
        )

    def decode(self) -> StoredResponse:
        """Raises StoreError when the stored text is not the JSON we wrote."""
        body = _loads(self.body, self.id)
        items = _loads(self.input_items, self.id)
        if not isinstance(body, dict) or not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise StoreError(f"stored response {self.id!r} is corrupt: unexpected JSON shape")
        return StoredResponse(
            id=self.id,
            created_at=self.created_at,
            body=body,
            input_items=tuple(items),
            instructions=self.instructions,
            owner=self.owner,
        )


def failed(record: StoredResponse, message: str) -> StoredResponse:
    """`record` with its response `failed`, the reason in its `error` as OpenAI words a server's failure."""
    error: JsonObject = {"code": "server_error", "message": message}
    body: JsonObject = {**record.body, "status": "failed", "error": error}
    return attrs.evolve(record, body=body)


def unfinished(record: StoredResponse) -> bool:
    return record.body.get("status") in UNFINISHED


def _dumps(value: object) -> str:
    # NaN and infinities (a -inf logprob) are kept as Python's JSON writes
    # them, so a record reads back exactly as it was stored.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str, response_id: str) -> object:
    try:
        value: object = json.loads(text)
    except ValueError as exc:  # JSONDecodeError and bad UTF-8 surrogates alike
        raise StoreError(f"stored response {response_id!r} is corrupt: {exc}") from exc
    return value


def check_limits(*, ttl_seconds: float, max_bytes: int) -> None:
    """Raises StoreError unless both limits are positive (the TTL may be infinite)."""
    if math.isnan(ttl_seconds) or ttl_seconds <= 0:
        raise StoreError(f"the response store TTL must be positive seconds, got {ttl_seconds}")
    if max_bytes <= 0:
        raise StoreError(f"the response store byte cap must be positive, got {max_bytes}")


@attrs.define
class StoreCounters:
    """A store's limits and this store object's counts: what every store reports the same way.

    Counting takes a lock of its own, so a store whose database does the
    ordering (PostgreSQL) needs no lock of its own for the counts.

    Raises:
        StoreError: a limit that is not positive, on construction.
    """

    ttl_seconds: float
    max_bytes: int
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _hits: int = attrs.field(default=0, init=False)
    _misses: int = attrs.field(default=0, init=False)
    _evictions: int = attrs.field(default=0, init=False)
    _expirations: int = attrs.field(default=0, init=False)
    _oversized: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        check_limits(ttl_seconds=self.ttl_seconds, max_bytes=self.max_bytes)

    def lookup(self, *, found: bool, expired: int = 0) -> None:
        """One `get`: a hit or a miss, and the records it found expired."""
        with self._lock:
            self._hits += found
            self._misses += not found
            self._expirations += expired

    def stored(self, *, expired: int = 0, evicted: int = 0, oversized: bool = False) -> None:
        """One `put` (or its sweep): records dropped for the TTL or the cap, and a refusal."""
        with self._lock:
            self._expirations += expired
            self._evictions += evicted
            self._oversized += oversized

    def statistics(
        self, *, kind: Literal["memory", "sqlite", "postgresql"], location: str | None, entries: int, size: int
    ) -> ResponseStoreStatistics:
        with self._lock:
            return ResponseStoreStatistics(
                kind=kind,
                location=location,
                entries=entries,
                bytes=size,
                max_bytes=self.max_bytes,
                ttl_seconds=self.ttl_seconds,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                expirations=self._expirations,
                oversized=self._oversized,
            )


@attrs.define
class _Entry:
    record: EncodedResponse
    last_used_at: float


@attrs.define
class MemoryResponseStore:
    """The default store: an LRU in one OrderedDict under one lock, gone at exit.

    The OrderedDict's order is both the LRU order and the expiry order,
    because a record's TTL restarts whenever its place in the LRU does.
    """

    _ttl: float = attrs.field(alias="ttl_seconds")
    _max_bytes: int = attrs.field(alias="max_bytes")
    _clock: Clock = attrs.field(default=time.time, alias="clock")
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _entries: collections.OrderedDict[str, _Entry] = attrs.field(factory=collections.OrderedDict, init=False)
    _events: dict[str, list[StoredEvent]] = attrs.field(factory=dict, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _counts: StoreCounters = attrs.field(init=False)

    @_counts.default
    def _within_limits(self) -> StoreCounters:
        return StoreCounters(ttl_seconds=self._ttl, max_bytes=self._max_bytes)

    def put(self, record: StoredResponse) -> None:
        encoded = EncodedResponse.encode(record)
        with self._lock:
            self._check_open()
            now = self._clock()
            self._sweep(now)
            # Storing a record again (a background response's new status) keeps its events.
            events = self._events.get(record.id)
            self._remove(record.id)
            if encoded.size > self._max_bytes:
                self._counts.stored(oversized=True)
                return
            if events is not None:
                self._events[record.id] = events
            self._entries[record.id] = _Entry(encoded, now)
            self._bytes += encoded.size
            while self._bytes > self._max_bytes:
                self._remove(next(iter(self._entries)))
                self._counts.stored(evicted=1)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            self._check_open()
            now = self._clock()
            entry = self._entries.get(response_id)
            expired = entry is not None and self._expired(entry, now)
            if expired:
                self._remove(response_id)
                entry = None
            self._counts.lookup(found=entry is not None, expired=expired)
            if entry is None:
                return None
            entry.last_used_at = now
            self._entries.move_to_end(response_id)
        return entry.record.decode()

    def delete(self, response_id: str) -> bool:
        with self._lock:
            self._check_open()
            entry = self._remove(response_id)
            return entry is not None and not self._expired(entry, self._clock())

    def add_events(self, response_id: str, events: Sequence[StoredEvent]) -> None:
        with self._lock:
            self._check_open()
            if response_id in self._entries:
                self._events.setdefault(response_id, []).extend(events)

    def events_after(self, response_id: str, after: int) -> list[StoredEvent]:
        with self._lock:
            self._check_open()
            return [event for event in self._events.get(response_id, ()) if event[0] > after]

    def fail_unfinished(self, message: str) -> int:
        with self._lock:
            self._check_open()
            records = [entry.record.decode() for entry in self._entries.values()]
            changed = [failed(record, message) for record in records if unfinished(record)]
            for record in changed:
                entry = self._entries[record.id]
                encoded = EncodedResponse.encode(record)
                self._bytes += encoded.size - entry.record.size
                entry.record = encoded
            return len(changed)

    def statistics(self) -> ResponseStoreStatistics:
        with self._lock:
            return self._counts.statistics(kind="memory", location=None, entries=len(self._entries), size=self._bytes)

    def close(self) -> None:
        with self._lock:
            self._entries.clear()
            self._events.clear()
            self._bytes = 0
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the response store is closed")

    def _expired(self, entry: _Entry, now: float) -> bool:
        return entry.last_used_at <= now - self._ttl

    def _sweep(self, now: float) -> None:
        # Oldest use first, so this stops at the first live record: a put costs O(expired).
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if not self._expired(oldest, now):
                return
            self._remove(oldest_id)
            self._counts.stored(expired=1)

    def _remove(self, response_id: str) -> _Entry | None:
        entry = self._entries.pop(response_id, None)
        self._events.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry.record.size
        return entry
