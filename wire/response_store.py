"""The Responses store: finished responses kept for `previous_response_id`.

One small synchronous interface, `ResponseStore`, with two backings: an
in-memory TTL + byte-capped LRU (the default) and SQLite
(`sqlite:///path`, `wire/response_store_sqlite.py`), which survives a
restart. Stores are thread-safe: the app calls them from worker threads,
never from the event loop. Every failure inside a store surfaces as
`StoreError`, which fails the one request that met it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import attrs

from pipeline.requests import JsonObject

Clock = Callable[[], float]


class StoreError(Exception):
    """The store could not do what was asked; the request fails, the server does not."""


@attrs.frozen(kw_only=True)
class StoredResponse:
    """A finished response and what a follow-up must replay before its own input.

    `input_items` include the history spliced in from earlier responses.
    """

    id: str
    created_at: float
    body: JsonObject
    input_items: tuple[JsonObject, ...]
    instructions: str | None


@attrs.frozen(kw_only=True)
class ResponseStoreStatistics:
    kind: str
    entries: int
    bytes: int
    max_bytes: int
    ttl_seconds: float
    hits: int
    misses: int
    evictions: int


class ResponseStore(Protocol):
    def put(self, record: StoredResponse) -> None: ...

    def get(self, response_id: str) -> StoredResponse | None:
        """None when the id is unknown or its entry expired."""
        ...

    def delete(self, response_id: str) -> bool:
        """False when the id is unknown."""
        ...

    def statistics(self) -> ResponseStoreStatistics: ...

    def close(self) -> None: ...


def open_store(url: str | None, *, ttl_seconds: float, max_bytes: int) -> ResponseStore:
    """The store a `MLX_RELAY_RESPONSE_STORE` value names.

    Raises:
        StoreError: an unknown scheme, or a database that cannot be opened.
    """
    if url is None or url in ("", "memory", "memory://"):
        return MemoryResponseStore(ttl_seconds=ttl_seconds, max_bytes=max_bytes)
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        from wire.response_store_sqlite import SqliteResponseStore

        return SqliteResponseStore(url.removeprefix("sqlite://"), ttl_seconds=ttl_seconds, max_bytes=max_bytes)
    raise StoreError(f"unknown response store {url!r}: use 'memory' or 'sqlite:///absolute/path.db'")


def encode(record: StoredResponse) -> str:
    return json.dumps(attrs.asdict(record), ensure_ascii=False, separators=(",", ":"))


def decode(text: str) -> StoredResponse:
    try:
        raw = json.loads(text)
        return StoredResponse(
            id=raw["id"],
            created_at=float(raw["created_at"]),
            body=raw["body"],
            input_items=tuple(raw["input_items"]),
            instructions=raw["instructions"],
        )
    except (ValueError, KeyError, TypeError) as error:
        raise StoreError(f"a stored response is corrupt: {error}") from None


@attrs.define
class MemoryResponseStore:
    """Process-local; gone with the process. A record larger than the cap is not kept."""

    _ttl: float = attrs.field(alias="ttl_seconds")
    _max_bytes: int = attrs.field(alias="max_bytes")
    _clock: Clock = attrs.field(default=time.time, alias="clock")
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    # id -> (stored at, size, encoded record); oldest use first.
    _entries: OrderedDict[str, tuple[float, int, str]] = attrs.field(factory=OrderedDict, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    _hits: int = attrs.field(default=0, init=False)
    _misses: int = attrs.field(default=0, init=False)
    _evictions: int = attrs.field(default=0, init=False)

    def put(self, record: StoredResponse) -> None:
        text = encode(record)
        size = len(text.encode())
        with self._lock:
            self._drop(record.id)
            self._sweep()
            if size > self._max_bytes:
                self._evictions += 1
                return
            self._entries[record.id] = (self._clock(), size, text)
            self._bytes += size
            while self._bytes > self._max_bytes:
                self._drop(next(iter(self._entries)))
                self._evictions += 1

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None or self._expired(entry[0]):
                self._drop(response_id)
                self._misses += 1
                return None
            self._entries.move_to_end(response_id)
            self._hits += 1
            return decode(entry[2])

    def delete(self, response_id: str) -> bool:
        with self._lock:
            entry = self._entries.get(response_id)
            self._drop(response_id)
            return entry is not None and not self._expired(entry[0])

    def statistics(self) -> ResponseStoreStatistics:
        with self._lock:
            return ResponseStoreStatistics(
                kind="memory",
                entries=len(self._entries),
                bytes=self._bytes,
                max_bytes=self._max_bytes,
                ttl_seconds=self._ttl,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
            )

    def close(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _expired(self, stored_at: float) -> bool:
        return self._clock() - stored_at > self._ttl

    def _sweep(self) -> None:
        # Entries are in use order, not age order: expired ones can sit anywhere.
        for response_id in [key for key, entry in self._entries.items() if self._expired(entry[0])]:
            self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry[1]
