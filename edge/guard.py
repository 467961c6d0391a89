"""What every request passes before a route sees it: CORS, the API key, the body's type and size.

Order matters. A CORS preflight is answered first, because browsers send
it without credentials. Then the key, so an unauthenticated client learns
nothing else. Then the body: JSON only (a `text/plain` or form POST is
what a web page can send cross-site without a preflight), and no larger
than the cap, refused from its declared length before a byte is read.
The audio routes take OpenAI's multipart form instead, under the audio
file's cap (docs/speech.md); a page elsewhere can post such a form
cross-site, which is why the API key matters on a server that listens
beyond loopback.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from quart import Quart, Request, Response, request

from edge.batch_calls import INTERNAL
from edge.edge_policy import EdgePolicy
from edge.keys import key_matches, presented_key
from edge.state import app_state
from pipeline.errors import ErrorKind, RequestError
from pipeline.settings import Settings

# Exempt from the key: a load balancer's probe must not need a secret, nor the chat page, which asks for one.
OPEN_PATHS = frozenset({"/health", "/"})
OPEN_PREFIXES = ("/assets/",)
_PREFLIGHT_MAX_AGE = "600"
_EXPOSED = "x-request-id, retry-after"
# The request headers a browser may send: the OpenAI and Anthropic SDKs' (with what the Stainless-built SDKs
# add to every request), tracing's and routers'.
_ALLOWED_HEADERS = (
    "authorization, content-type, x-api-key, x-request-id, traceparent, tracestate, x-session-affinity, "
    "x-smg-routing-key, openai-organization, openai-project, openai-beta, anthropic-version, anthropic-beta, "
    "anthropic-dangerous-direct-browser-access, x-stainless-arch, x-stainless-lang, x-stainless-os, "
    "x-stainless-package-version, x-stainless-runtime, x-stainless-runtime-version, x-stainless-retry-count, "
    "x-stainless-timeout, x-stainless-read-timeout, x-stainless-async, x-stainless-helper-method"
)
# The routes whose bodies are multipart forms (OpenAI's audio uploads), not JSON.
AUDIO_PREFIX = "/v1/audio/"
# OpenAI's file upload, a multipart form too, capped by the files' own setting (edge/file_routes.py).
FILES_PATH = "/v1/files"
# A client's trace id is echoed only when it is short and plain; otherwise the server's own id is used.
_TRACE_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def configure(app: Quart, settings: Settings) -> EdgePolicy:
    """Apply the settings to the running app: Quart's own body limits; the policy the hooks read is returned, for
    the lifespan to keep in the app's state (edge/state.py)."""
    policy = EdgePolicy.from_settings(settings)
    # Quart enforces these while reading a body whose length was not declared up front (the audio forms: their own).
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.request_class = _request_class(policy.max_audio_body_bytes, policy.max_file_body_bytes)
    app.config["BODY_TIMEOUT"] = settings.body_timeout
    return policy


class _EdgeRequest(Request):
    """Quart's request, whose body cap on the audio routes is the audio form's rather than the JSON one."""

    audio_max_content_length: ClassVar[int]
    file_max_content_length: ClassVar[int]

    def __init__(
        self, method: str, scheme: str, path: str, *args: Any, max_content_length: int | None = None, **kwargs: Any
    ) -> None:
        if path.startswith(AUDIO_PREFIX):
            max_content_length = self.audio_max_content_length
        elif path == FILES_PATH:
            max_content_length = self.file_max_content_length
        super().__init__(method, scheme, path, *args, max_content_length=max_content_length, **kwargs)


def _request_class(audio_cap: int, file_cap: int) -> type[Request]:
    class EdgeRequest(_EdgeRequest):
        audio_max_content_length = audio_cap
        file_max_content_length = file_cap

    return EdgeRequest


def install(app: Quart) -> None:
    app.before_request(_guard)
    app.after_request(_allow_origin)


def trace_id(fallback: str) -> str:
    sent = request.headers.get("x-request-id", "")
    return sent if _TRACE_ID.fullmatch(sent) else fallback


def policy() -> EdgePolicy:
    """The running app's policy.

    Raises:
        NotStarted: before the lifespan has started the app (no request is served before then).
    """
    return app_state().running.policy


async def _guard() -> Response | None:
    current = policy()
    if request.method == "OPTIONS":
        return _preflight(current)
    internal = request.scope.get(INTERNAL) is True
    if current.keys and not internal and request.path not in OPEN_PATHS and not request.path.startswith(OPEN_PREFIXES):
        _authenticate(current)
    if request.method == "POST":
        _check_body(current)
    return None


def _preflight(policy: EdgePolicy) -> Response | None:
    origin = request.headers.get("origin")
    if origin is None or origin not in policy.origins:
        return None  # Quart's automatic OPTIONS answer, with no CORS headers: the browser refuses.
    response = Response("", status=204)
    response.headers["access-control-allow-origin"] = origin
    response.headers["access-control-allow-methods"] = "GET, POST, DELETE, OPTIONS"
    # A fixed list, never an echo of what was asked.
    response.headers["access-control-allow-headers"] = _ALLOWED_HEADERS
    response.headers["access-control-max-age"] = _PREFLIGHT_MAX_AGE
    return response


def _authenticate(policy: EdgePolicy) -> None:
    presented = presented_key(request.headers.get("authorization"), request.headers.get("x-api-key"))
    if presented is None:
        raise RequestError(
            kind=ErrorKind.UNAUTHENTICATED,
            message="Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
            # OpenAI leaves this code null; a client can tell the two 401s apart by it here.
            code="missing_api_key",
        )
    if not key_matches(presented, policy.keys):
        raise RequestError(kind=ErrorKind.UNAUTHENTICATED, message="Incorrect API key provided", code="invalid_api_key")


def _check_body(policy: EdgePolicy) -> None:
    if request.path.startswith(AUDIO_PREFIX):
        _check_form(policy.max_audio_body_bytes)
        return
    if request.path == FILES_PATH:
        _check_form(policy.max_file_body_bytes)
        return
    if request.mimetype != "application/json":
        raise RequestError(
            kind=ErrorKind.UNSUPPORTED_MEDIA_TYPE,
            message="The request body must be JSON, sent with 'Content-Type: application/json'",
        )
    declared = request.content_length
    if declared is not None and declared > policy.max_body_bytes:
        raise too_large(policy.max_body_bytes)


def _check_form(limit: int) -> None:
    if request.mimetype != "multipart/form-data":
        raise RequestError(
            kind=ErrorKind.UNSUPPORTED_MEDIA_TYPE,
            message="The request body must be a multipart form, sent with 'Content-Type: multipart/form-data'",
        )
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(limit)


def too_large(limit: int) -> RequestError:
    return RequestError(
        kind=ErrorKind.TOO_LARGE, message=f"The request body is larger than this server's limit of {limit} bytes"
    )


async def _allow_origin(response: Response) -> Response:
    origin = request.headers.get("origin")
    if origin is not None and origin in policy().origins:
        response.headers["access-control-allow-origin"] = origin
        response.headers["access-control-expose-headers"] = _EXPOSED
        response.headers.add("vary", "Origin")
    return response
