"""The Responses store as the routes use it: one operation at a time off the event loop.

A store failure (`StoreError`) fails only the request that met it: it is
logged and answered 500 with nothing of the store's own text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import anyio
import structlog
from quart import Quart

from pipeline.errors import ErrorKind, RequestError
from store.response_store import ResponseStore, StoreError

T = TypeVar("T")

log = structlog.get_logger(stage="http")


async def store_call(app: Quart, call: Callable[[ResponseStore], T]) -> T:
    # The app is passed, not read from `current_app`: a stream's persist hook runs outside any app context.
    store = cast(ResponseStore, app.extensions["response_store"])
    try:
        return await anyio.to_thread.run_sync(call, store)
    except StoreError as error:
        log.error("response_store.failed", error=str(error))
        raise RequestError(kind=ErrorKind.INTERNAL, message="The response store failed; nothing was saved") from None
