"""The Responses store as the routes use it: one operation at a time off the event loop.

A store failure (`StoreError`) fails only the request that met it: it is
logged and answered 500 with nothing of the store's own text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import structlog

from pipeline.errors import ErrorKind, RequestError
from store.response_store import ResponseStore, StoreError

T = TypeVar("T")

log = structlog.get_logger(stage="http")


async def store_call(store: ResponseStore, call: Callable[[ResponseStore], T]) -> T:
    """`call(store)` on a worker thread.

    Raises:
        RequestError: 500, when the store fails (`StoreError`).
    """
    try:
        return await anyio.to_thread.run_sync(call, store)
    except StoreError as error:
        log.error("response_store.failed", error=str(error))
        raise RequestError(kind=ErrorKind.INTERNAL, message="The response store failed; nothing was saved") from None
