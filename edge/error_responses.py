"""Errors rendered in the shape of the API the client called, and the app's handlers that render them.

Takes a `RequestError` (or an HTTP exception Quart raised, or any exception a route let escape) and
gives the `Response` an OpenAI, Anthropic (`/v1/messages…`) or Ollama (`/api/…`) client expects:
its body, its status, and `retry-after` where the error carries one. One table maps error kinds to
HTTP (docs/STYLE.md, "Validate at the boundary"); `install` puts the handlers on the app.
"""

from __future__ import annotations

import structlog
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from edge import guard
from pipeline.errors import ErrorKind, RequestError, internal_error
from pipeline.requests import JsonValue
from wire import anthropic, ollama, openai
from wire.sse import dumps

log = structlog.get_logger(stage="http")

_HTTP_KINDS = {
    404: ErrorKind.NOT_FOUND,
    405: ErrorKind.METHOD_NOT_ALLOWED,
    408: ErrorKind.BODY_TIMEOUT,
    413: ErrorKind.TOO_LARGE,
    415: ErrorKind.UNSUPPORTED_MEDIA_TYPE,
}


def install(app: Quart) -> None:
    """Every error a route raises or lets escape answers in its API's shape."""
    app.register_error_handler(RequestError, _request_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)


async def _request_error(error: RequestError) -> Response:
    return error_response(error)


async def _http_error(error: HTTPException) -> Response:
    kind = _HTTP_KINDS.get(error.code or 500, ErrorKind.INVALID_REQUEST)
    if kind is ErrorKind.TOO_LARGE:
        return error_response(guard.too_large(guard.policy().max_body_bytes))
    return error_response(RequestError(kind=kind, message=f"{request.method} {request.path}: {error.name}"))


async def _unexpected_error(error: Exception) -> Response:
    # The route's own isolation boundary, as pipeline/actor.py is the actors': this request fails, nothing else.
    log.error("request.internal_error", path=request.path, trace_id=request.headers.get("x-request-id"), exc_info=error)
    return error_response(internal_error())


def error_response(error: RequestError) -> Response:
    """The error in the shape of the API the client called."""
    headers = {"retry-after": str(max(1, round(error.retry_after)))} if error.retry_after is not None else {}
    status, body = error_parts(error)
    return Response(body, status=status, content_type="application/json", headers=headers)


def error_parts(error: RequestError) -> tuple[int, str]:
    """The status and JSON body of `error` for the API of the request being served."""
    if request.path.startswith("/v1/messages"):
        return anthropic.error_status(error), dumps(anthropic.error_body(error))
    if request.path.startswith("/api/"):
        return ollama.error_status(error), dumps(ollama.error_body(error))
    return error.status, dumps(openai.error_body(error))


def json_response(body: JsonValue, *, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(body), status=status, content_type="application/json", headers=headers)
