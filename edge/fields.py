"""The unknown-field policy at the HTTP edge (`wire/field_policy.py`): one watch per request.

The decoder runs wherever the route hands it (the engine's preparation, or
the route itself); the watch keeps the fields it did not read, and the
route reports them once: one log line and the `x-mlx-relay-ignored-fields`
header. In strict mode the decode fails instead, with a 400 naming them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import attrs
import structlog
from quart import current_app

from pipeline.requests import JsonValue
from wire.field_policy import IGNORED_HEADER, decode_noting_unread, header_value

T = TypeVar("T")
log = structlog.get_logger(stage="http")


@attrs.define
class FieldWatch:
    api: str
    strict: bool
    unread: tuple[str, ...] = ()

    @classmethod
    def for_api(cls, api: str) -> FieldWatch:
        return cls(api=api, strict=cast(bool, current_app.extensions.get("strict_fields", False)))

    def decode(self, decode: Callable[[JsonValue], T]) -> Callable[[JsonValue], T]:
        def watched(value: JsonValue) -> T:
            decoded, self.unread = decode_noting_unread(decode, value, self.api, strict=self.strict)
            return decoded

        return watched

    def report(self, headers: dict[str, str], *, trace_id: str) -> dict[str, str]:
        """`headers`, with the ignored fields named when there were any (logged once here)."""
        if self.unread:
            log.warning("request.fields_ignored", trace_id=trace_id, api=self.api, fields=list(self.unread[:100]))
            headers[IGNORED_HEADER] = header_value(self.unread)
        return headers
