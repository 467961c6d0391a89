"""The unknown-field policy at the HTTP edge (`wire/field_policy.py`): one watch per request.

A route decodes its body through `watched(api, decoder)`; the decoder runs
wherever the route hands it (the engine's preparation, or the route
itself), and the watch, kept on the request's `g`, holds the fields it did
not read. An `after_request` hook reports them once: one log line and the
`x-mlx-relay-ignored-fields` header. In strict mode the decode fails
instead, with a 400 naming them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import attrs
import structlog
from quart import Quart, Response, current_app, g

from pipeline.requests import JsonValue
from wire.field_policy import IGNORED_HEADER, decode_noting_unread, header_value

T = TypeVar("T")
log = structlog.get_logger(stage="http")


@attrs.define
class FieldWatch:
    api: str
    strict: bool
    unread: tuple[str, ...] = ()

    def decode(self, decode: Callable[[JsonValue], T]) -> Callable[[JsonValue], T]:
        def watched(value: JsonValue) -> T:
            decoded, self.unread = decode_noting_unread(decode, value, self.api, strict=self.strict)
            return decoded

        return watched


def watched(api: str, decode: Callable[[JsonValue], T]) -> Callable[[JsonValue], T]:
    """`decode`, noting for this request the fields it leaves unread (refusing them in strict mode)."""
    watch = FieldWatch(api=api, strict=cast(bool, current_app.extensions.get("strict_fields", False)))
    g.field_watch = watch
    return watch.decode(decode)


def install(app: Quart) -> None:
    app.after_request(_report)


async def _report(response: Response) -> Response:
    watch = cast(FieldWatch | None, g.get("field_watch"))
    if watch is not None and watch.unread:
        trace_id = response.headers.get("x-request-id")
        log.warning("request.fields_ignored", trace_id=trace_id, api=watch.api, fields=list(watch.unread[:100]))
        response.headers[IGNORED_HEADER] = header_value(watch.unread)
    return response
