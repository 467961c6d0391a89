"""pipeline/errors.py: the error vocabulary and its HTTP statuses."""

from __future__ import annotations

import pytest

from pipeline.errors import ErrorKind, RequestError, engine_dead, invalid, overloaded, shutting_down, unsupported


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        pytest.param(ErrorKind.INVALID_REQUEST, 400, id="invalid"),
        pytest.param(ErrorKind.UNAUTHENTICATED, 401, id="unauthenticated"),
        pytest.param(ErrorKind.NOT_FOUND, 404, id="not-found"),
        pytest.param(ErrorKind.UNAUTHENTICATED, 401, id="unauthenticated"),
        pytest.param(ErrorKind.METHOD_NOT_ALLOWED, 405, id="method-not-allowed"),
        pytest.param(ErrorKind.BODY_TIMEOUT, 408, id="body-timeout"),
        pytest.param(ErrorKind.TOO_LARGE, 413, id="too-large"),
        pytest.param(ErrorKind.UNSUPPORTED_MEDIA_TYPE, 415, id="unsupported-media-type"),
        pytest.param(ErrorKind.OVERLOADED, 429, id="overloaded"),
        pytest.param(ErrorKind.UNAVAILABLE, 503, id="unavailable"),
        pytest.param(ErrorKind.INTERNAL, 500, id="internal"),
    ],
)
def test_status_of_each_kind(kind: ErrorKind, status: int) -> None:
    """Each kind maps to one HTTP status."""
    assert RequestError(kind=kind, message="m").status == status


def test_every_kind_has_a_status() -> None:
    """No error kind can reach app.py without a status."""
    assert {RequestError(kind=kind, message="m").status for kind in ErrorKind} <= {
        400,
        401,
        403,
        404,
        405,
        408,
        413,
        415,
        429,
        500,
        503,
    }


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        pytest.param(
            invalid("bad value", param="stop", code="c"),
            (ErrorKind.INVALID_REQUEST, 400, "bad value", "stop", "c", None),
            id="invalid",
        ),
        pytest.param(
            unsupported("tools"),
            (
                ErrorKind.INVALID_REQUEST,
                400,
                "'tools' is not supported by this server yet",
                "tools",
                "unsupported_parameter",
                None,
            ),
            id="unsupported",
        ),
        pytest.param(
            overloaded(2.5),
            (
                ErrorKind.OVERLOADED,
                429,
                "The server is at capacity; retry after the suggested delay",
                None,
                "rate_limit_exceeded",
                2.5,
            ),
            id="overloaded",
        ),
        pytest.param(
            shutting_down(),
            (ErrorKind.UNAVAILABLE, 503, "The server is shutting down", None, "shutting_down", None),
            id="shutting-down",
        ),
        pytest.param(
            engine_dead(),
            (
                ErrorKind.UNAVAILABLE,
                503,
                "The inference engine has stopped; see the server log",
                None,
                "engine_dead",
                None,
            ),
            id="engine-dead",
        ),
    ],
)
def test_constructors(error: RequestError, expected: tuple[object, ...]) -> None:
    """Each helper builds the error the API layer renders: kind, status, message, param, code, retry_after."""
    assert (error.kind, error.status, error.message, error.param, error.code, error.retry_after) == expected


def test_a_request_error_is_raisable_and_prints_its_message() -> None:
    """RequestError is an ordinary exception whose str() is the client-facing message only."""
    with pytest.raises(RequestError) as caught:
        raise invalid("'n' must be >= 1", param="n")
    assert str(caught.value) == "'n' must be >= 1"
    assert isinstance(caught.value, Exception)


def test_errors_compare_by_identity() -> None:
    """Two failures with the same text are still two failures (eq=False)."""
    assert invalid("x") != invalid("x")
    error = invalid("x")
    assert error == error
