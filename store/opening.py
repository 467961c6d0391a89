"""Which Responses store a `MLX_RELAY_RESPONSE_STORE` URL names, opened.

Apart from `store/response_store.py` so the backends import the records and the policy from below, and this module
imports every backend from above: no circle between a store and its backends.
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

from store.postgres import PostgresResponseStore, is_postgres_url
from store.response_store import Clock, MemoryResponseStore, ResponseStore, StoreError
from store.sqlite import SqliteResponseStore


def store_path(url: str | None) -> Path | None:
    """The SQLite file a store URL names, or None for the memory store.

    Accepted: unset, "", "memory" or "memory://"; "sqlite:///abs/path.db" (and
    SQLAlchemy's "sqlite:////abs/path.db", the same file); "sqlite:rel.db",
    relative to the working directory. Percent-escapes are decoded.

    Raises:
        StoreError: any other URL, with what would have been accepted.
    """
    text = (url or "").strip()
    if text in ("", "memory", "memory://"):
        return None
    parts = urlsplit(text)
    if parts.scheme.lower() != "sqlite":
        raise StoreError(f"unknown response store {text!r}: {_ACCEPTED}")
    if parts.netloc:
        raise StoreError(f"response store {text!r} names a host {parts.netloc!r}: {_ACCEPTED}")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise StoreError(f"response store {text!r} takes no query or fragment: {_ACCEPTED}")
    path = unquote(parts.path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if path in ("", "/") or path.endswith("/"):
        raise StoreError(f"response store {text!r} names no database file: {_ACCEPTED}")
    if path == ":memory:":
        raise StoreError(f"response store {text!r}: for a store in memory, write 'memory'")
    return Path(path)


_ACCEPTED = "use 'memory', 'sqlite:///absolute/path.db', 'sqlite:relative/path.db' or 'postgresql://user@host/database'"


def open_store(url: str | None, *, ttl_seconds: float, max_bytes: int, clock: Clock = time.time) -> ResponseStore:
    """Open the store that `url` names: a postgresql:// (or postgres://) URL in
    libpq's form, else see `store_path`.

    Raises:
        StoreError: a bad URL or limit, or a database that cannot be opened
            (a settings error at startup).
    """
    if is_postgres_url(url):
        assert url is not None
        return PostgresResponseStore(url.strip(), ttl_seconds=ttl_seconds, max_bytes=max_bytes, clock=clock)
    path = store_path(url)
    if path is None:
        return MemoryResponseStore(ttl_seconds=ttl_seconds, max_bytes=max_bytes, clock=clock)
    return SqliteResponseStore(path, ttl_seconds=ttl_seconds, max_bytes=max_bytes, clock=clock)
