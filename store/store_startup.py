"""Start-up failures a user can act on: one clear line and a way forward, never a stack trace."""

from __future__ import annotations

import time
from pathlib import Path

from pipeline.settings import Settings
from store.opening import open_store, store_path
from store.postgres import redacted
from store.response_store import ResponseStore, StoreError

# SQLite keeps these beside the file in WAL mode; they move with it.
_COMPANIONS = ("", "-wal", "-shm")


class StartupError(Exception):
    """The server cannot start; the message says why and what to do, in one line."""


def open_response_store(settings: Settings) -> ResponseStore:
    """The Responses store the settings name; with `reset_store`, one that will not open is moved aside.

    Raises:
        StartupError: the store cannot be opened (and was not to be reset).
    """
    try:
        return _open(settings)
    except StoreError as error:
        path = _existing_path(settings.response_store)
        if path is None or not settings.reset_store:
            raise StartupError(_advice(settings.response_store, error, path)) from None
        moved = move_aside(path)
    try:
        store = _open(settings)
    except StoreError as error:
        raise StartupError(f"the response store cannot be opened even after moving it aside: {error}") from None
    from structlog import get_logger

    get_logger(stage="startup").warning("response_store.reset", moved_to=moved.name)
    return store


def move_aside(path: Path) -> Path:
    """Rename the store (and its WAL files) to `<name>.corrupt-<UTC time>`; the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in _COMPANIONS:
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.rename(Path(f"{target}{suffix}"))
    return target


def _open(settings: Settings) -> ResponseStore:
    return open_store(
        settings.response_store, ttl_seconds=settings.response_store_ttl, max_bytes=settings.response_store_bytes
    )


def _existing_path(url: str | None) -> Path | None:
    try:
        path = store_path(url)
    except StoreError:
        return None
    return path if path is not None and path.is_file() else None


def _advice(url: str | None, error: StoreError, path: Path | None) -> str:
    if path is None:
        shown = redacted(url) if url is not None else None
        return f"the response store {shown!r} cannot be opened: {error}. Check MLX_RELAY_RESPONSE_STORE."
    return (
        f"the response store {path} cannot be opened: {error}. To keep the file for inspection and start with an "
        "empty store, run `mlx-relay serve --reset-store` (or set MLX_RELAY_RESET_STORE=1); "
        "or point MLX_RELAY_RESPONSE_STORE at another file."
    )
