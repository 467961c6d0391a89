"""The unknown-field policy at the HTTP edge (`wire/field_policy.py`): one report per request.

A generation route hands the parse stage `watched(api, decoder)`: the
decoded request carries the fields the decoder did not read
(`unread_fields`), and the route reports them once the request is accepted
(`report`, edge/generation.py). A route that decodes its body itself takes
`decode_here`, which reports them at once. Either way the report is made in
the route's own task, never in the stage that ran the decoder: the
`after_request` hook then writes one log line and the
`x-mlx-relay-ignored-fields` header. In strict mode the decode fails
instead, with a 400 naming them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import attrs
import structlog
from quart import Quart, Response, g

from edge.state import app_state
from pipeline.requests import GenerationRequest, JsonValue
from wire.field_policy import IGNORED_HEADER, decode_noting_unread, header_value

T = TypeVar("T")
log = structlog.get_logger(stage="http")


@attrs.frozen
class _Ignored:
    api: str
    fields: tuple[str, ...]


def watched(api: str, decode: Callable[[JsonValue], GenerationRequest]) -> Callable[[JsonValue], GenerationRequest]:
    """`decode`, its request carrying the fields it leaves unread (refusing them in strict mode).

    Called in the route's task; the decoder it returns runs in the parse stage's, so it writes nothing into the
    request's context: the route names the fields with `report` once it holds the accepted request.
    """
    strict = app_state().running.settings.strict_fields
    g.field_api = api

    def decode_watched(value: JsonValue) -> GenerationRequest:
        decoded, unread = decode_noting_unread(decode, value, api, strict=strict)
        return attrs.evolve(decoded, unread_fields=unread) if unread else decoded

    return decode_watched


def decode_here(api: str, decode: Callable[[JsonValue], T], value: JsonValue) -> T:
    """`decode(value)` run by the route itself, the fields it leaves unread reported on this response."""
    decoded, unread = decode_noting_unread(decode, value, api, strict=app_state().running.settings.strict_fields)
    _name(api, unread)
    return decoded


def report(request: GenerationRequest) -> None:
    """Name the accepted `request`'s unread fields on the current response (from the route's task), under the
    API its `watched` decoder named."""
    _name(cast(str, g.get("field_api", "")), request.unread_fields)


def _name(api: str, unread: tuple[str, ...]) -> None:
    if unread:
        g.ignored_fields = _Ignored(api=api, fields=unread)


def install(app: Quart) -> None:
    app.after_request(_report)


async def _report(response: Response) -> Response:
    ignored = cast(_Ignored | None, g.get("ignored_fields"))
    if ignored is not None:
        trace_id = response.headers.get("x-request-id")
        log.warning("request.fields_ignored", trace_id=trace_id, api=ignored.api, fields=list(ignored.fields[:100]))
        response.headers[IGNORED_HEADER] = header_value(ignored.fields)
    return response
