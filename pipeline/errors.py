"""The error vocabulary shared by every layer.

A `RequestError` is a failure that belongs to one request: it is raised at
the boundary (decoders, stages) or delivered as a value on the request's
reply, and `edge/error_responses.py` renders it in the error shape of the API in use. The
engine keeps serving after any of them.
"""

from __future__ import annotations

import enum

import attrs


class ErrorKind(enum.Enum):
    """What went wrong, independent of any API's spelling of it."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TIMEOUT = "body_timeout"
    TOO_LARGE = "too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    OVERLOADED = "overloaded"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


_STATUS = {
    ErrorKind.INVALID_REQUEST: 400,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
    ErrorKind.BODY_TIMEOUT: 408,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorKind.OVERLOADED: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}


# Characters of the client's input an error message may quote.
EXCERPT_CHARS = 200
# A whole message's bound, whatever went into it: a 400 stays a short answer.
MESSAGE_CHARS = 2000


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def _bounded(text: str) -> str:
    return excerpt(text, MESSAGE_CHARS)


@attrs.frozen(kw_only=True, eq=False)
class RequestError(Exception):
    """A failure of one request, safe to show to its client.

    `message` is written for the client; it never carries text from inside
    the engine (no `str(e)` of an unexpected exception).
    """

    kind: ErrorKind
    message: str = attrs.field(converter=_bounded)
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None

    @property
    def status(self) -> int:
        return _STATUS[self.kind]

    def __str__(self) -> str:
        return self.message


def invalid(message: str, *, param: str | None = None, code: str | None = None) -> RequestError:
    return RequestError(kind=ErrorKind.INVALID_REQUEST, message=message, param=param, code=code)


def unsupported(param: str) -> RequestError:
    return invalid(f"'{param}' is not supported by this server yet", param=param, code="unsupported_parameter")


def overloaded(retry_after: float) -> RequestError:
    return RequestError(
        kind=ErrorKind.OVERLOADED,
        message="The server is at capacity; retry after the suggested delay",
        code="rate_limit_exceeded",
        retry_after=retry_after,
    )


def shutting_down() -> RequestError:
    return RequestError(kind=ErrorKind.UNAVAILABLE, message="The server is shutting down", code="shutting_down")


def engine_dead() -> RequestError:
    return RequestError(
        kind=ErrorKind.UNAVAILABLE, message="The inference engine has stopped; see the server log", code="engine_dead"
    )


def internal_error() -> RequestError:
    """Our bug, met while handling one request: the request fails, the server carries on."""
    return RequestError(
        kind=ErrorKind.INTERNAL,
        message="The server hit an internal error while handling this request; the server log has the details",
        code="internal_error",
    )


def first_error(error: BaseException) -> BaseException:
    """The first error inside any task groups' exception groups (the one that started the others' cancelling)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def reason_of(error: BaseException) -> str:
    """What went wrong, in one line, named by its type."""
    first = first_error(error)
    return f"{type(first).__name__}: {first}"


def quote(value: object) -> str:
    """A value of the client's, as a message quotes it: its repr, cut short."""
    return excerpt(repr(value), 80)
