"""The Responses API over WebSocket on `/v1/responses`: the transport the Codex CLI dials first.

One `{"type": "response.create", ...body...}` text frame starts a turn;
each Responses stream event comes back as one text frame holding exactly
the `data:` payload the HTTP route streams (with its `sequence_number`).
A connection serves turns one after another, as Codex sends them: a
second `response.create` while one is running is refused in-band. The
turn goes through the same preparation (`edge/responses_turn.py`), engine
entry and stream body (`edge/streaming.py`) as the HTTP route.

`generate: false` pre-warms: the conversation is prefilled into the prompt
cache (one token is sampled and dropped) and the turn completes with no
output, stored so that the next turn can continue it by
`previous_response_id`, as Codex does with its pre-warm.

Failures are in-band `{"type": "error", "status": N, "error": {...}}`
frames in OpenAI's error shape (Codex reads `status`), and the connection
stays usable. A client that closes mid-turn ends that turn: Quart cancels
the handler, and leaving the reply closes it, which drops the row. Keys
and origins are checked on the upgrade, so a refused client gets a plain
HTTP status (401, 403) and never a socket. When the server is told to
stop, each open socket ends its running turn with `response.failed` and
closes with 1001 before HTTP drains. A socket with no turn and no frame
for `MLX_RELAY_SOCKET_IDLE_TIMEOUT` seconds is closed with 1000.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import anyio
import attrs
import structlog
from quart import Blueprint, Quart, Response, current_app, websocket

from edge import guard
from edge.aliases import with_model
from edge.choice import chosen, current_defaults, model_named
from edge.keys import key_matches, presented_key
from edge.responses_turn import ResponsesTurn, prepare_turn
from edge.sessions import session_key
from edge.streaming import Persist, sse_body
from fleet.defaults import with_defaults
from pipeline.errors import ErrorKind, RequestError, invalid, shutting_down
from pipeline.events import FinishReason, Summary
from pipeline.protocol import StreamProtocol
from pipeline.requests import GenerationRequest, JsonObject, JsonValue, with_cache_key
from stages.messages import Decoder, ReadBody, Reply
from stages.prompt.parse import load_json
from wire import openai
from wire.sse import dumps

log = structlog.get_logger(stage="socket")

routes = Blueprint("responses_socket", __name__)

_SESSIONS = "responses_sockets"
# RFC 6455: a normal closure (an idle socket), and an endpoint going away (a server shutting down).
NORMAL = 1000
GOING_AWAY = 1001


@routes.websocket("/v1/responses")
async def responses_socket() -> Response | None:
    refusal = _refusal()
    if refusal is not None:
        return _error_response(refusal)
    app = cast(Quart, current_app._get_current_object())  # type: ignore[attr-defined]
    await websocket.accept()
    session = Session(app=app)
    sessions(app).add(session)
    log.info("socket.opened", path=websocket.path)
    try:
        await session.run()
    finally:
        sessions(app).discard(session)
        log.info("socket.closed", turns=session.turns)
    return None


@routes.get("/v1/responses")
async def responses_without_upgrade() -> Response:
    """A plain GET: 426 names the upgrade this path wants (the status on which Codex falls back to POST)."""
    response = _error_response(
        invalid("GET /v1/responses is the Responses WebSocket: send 'Upgrade: websocket', or POST a request")
    )
    response.status_code = 426
    response.headers["upgrade"] = "websocket"
    return response


def sessions(app: Quart) -> set[Session]:
    return cast(set["Session"], app.extensions.setdefault(_SESSIONS, set()))


def close_all(app: Quart) -> None:
    """End every socket's running turn and close it (the server is stopping); synchronous, for a signal handler."""
    for session in list(sessions(app)):
        session.stop()


def _refusal() -> RequestError | None:
    """Why the upgrade is refused: the same key rules as HTTP, the origin as CORS allows it, a server stopping."""
    policy = guard.policy()
    if policy.keys:
        presented = presented_key(websocket.headers.get("authorization"), websocket.headers.get("x-api-key"))
        if presented is None:
            return RequestError(
                kind=ErrorKind.UNAUTHENTICATED,
                message="Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="missing_api_key",
            )
        if not key_matches(presented, policy.keys):
            return RequestError(
                kind=ErrorKind.UNAUTHENTICATED, message="Incorrect API key provided", code="invalid_api_key"
            )
    origin = websocket.headers.get("origin")
    # Browsers send an Origin on every upgrade and no CORS check guards a socket: a foreign page is refused here.
    if origin is not None and origin.rstrip("/") not in policy.origins and not _same_origin(origin):
        return RequestError(kind=ErrorKind.FORBIDDEN, message=f"Origin {origin!r} is not allowed")
    if "fleet" not in current_app.extensions:
        return shutting_down()
    return None


def _same_origin(origin: str) -> bool:
    host = websocket.headers.get("host", "")
    return origin.rstrip("/") in (f"http://{host}", f"https://{host}")


def _error_response(error: RequestError) -> Response:
    return Response(dumps(openai.error_body(error)), status=error.status, content_type="application/json")


def error_frame(error: RequestError) -> str:
    """An in-band failure: OpenAI's error body, with the HTTP status Codex reads from `status`."""
    body = openai.error_body(error)
    return dumps({"type": "error", "status": error.status, "error": body["error"]})


def data_payloads(chunk: bytes) -> list[str]:
    """The `data:` payloads of the SSE frames in `chunk`; comments (keepalives) carry none."""
    payloads = []
    for event in chunk.decode().split("\n\n"):
        lines = [line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")]
        if lines:
            payloads.append("\n".join(lines))
    return payloads


@attrs.define(eq=False)
class Session:
    """One socket: its turns one at a time, and what ends them."""

    app: Quart
    turns: int = 0
    _busy: bool = False
    _protocol: StreamProtocol | None = None
    _send_lock: anyio.Lock = attrs.field(factory=anyio.Lock)
    _stopping: anyio.Event = attrs.field(factory=anyio.Event)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._close_when_stopped, group.cancel_scope)
            while True:
                message = await self._next_frame()
                if message is None:
                    await websocket.close(NORMAL, "idle")
                    group.cancel_scope.cancel()
                    return
                body = self._request_of(message)
                if isinstance(body, RequestError):
                    await self.send(error_frame(body))
                elif body is not None:
                    self._busy = True
                    group.start_soon(self._turn, body)

    async def _next_frame(self) -> str | bytes | None:
        """The next frame; None once the socket has been idle (no turn, no frame) for the idle timeout."""
        idle = cast(float, self.app.extensions.get("socket_idle_timeout", 900.0))
        while True:
            with anyio.move_on_after(idle):
                return await websocket.receive()
            if not self._busy:
                return None

    async def send(self, text: str) -> None:
        async with self._send_lock:
            await websocket.send(text)

    def _request_of(self, message: str | bytes) -> JsonObject | RequestError | None:
        """The body of a `response.create` frame; an error for a bad frame; None for a frame to ignore."""
        if isinstance(message, bytes):
            return invalid("Binary frames are not accepted: send each request as a JSON text frame")
        limit = guard.policy().max_body_bytes
        if len(message.encode()) > limit:
            return guard.too_large(limit)
        try:
            frame = load_json(message.encode())
        except RequestError as error:
            return error
        if not isinstance(frame, dict):
            return invalid("A frame must be a JSON object with a 'type'")
        kind = frame.get("type")
        if kind == "response.processed":
            # Codex acknowledges a finished turn; nothing is owed for it.
            return None
        if kind != "response.create":
            return invalid(f"Unknown frame type {kind!r}: expected 'response.create'", param="type")
        if self._busy:
            return invalid("A response is already in progress on this connection", code="response_in_progress")
        return {key: value for key, value in frame.items() if key != "type"}

    async def _turn(self, body: JsonObject) -> None:
        try:
            await self._run_turn(body)
        except RequestError as error:
            await self.send(error_frame(error))
        finally:
            self._busy = False
            self._protocol = None
            self.turns += 1

    async def _run_turn(self, body: JsonObject) -> None:
        generate = body.pop("generate", True)
        if not isinstance(generate, bool):
            raise invalid("'generate' must be a boolean", param="generate")
        turn = await prepare_turn(self.app, body, trace_id=websocket.headers.get("x-request-id"))
        if not generate:
            turn = _warm_only(turn)
        # The generation entry's steps, as the HTTP route takes them (app.py `_generate`): the model the body names,
        # its defaults, then admission; the parse stage takes the frame's body as read here, not read again.
        model, read = model_named(ReadBody(body))
        async with chosen(model) as engine:
            decode = with_defaults(with_model(_in_session(turn.decode)), current_defaults())
            reply = await engine.submit(request_id=turn.request_id, trace_id=turn.request_id, body=read, decode=decode)
        with reply:
            accepted = await reply.accepted()
            protocol = self._protocol = turn.make_protocol(accepted, turn.request_id, reply)
            log.info("socket.turn", request_id=turn.request_id, generate=generate)
            if generate:
                frames = sse_body(reply, protocol, turn.persist, self.app.extensions["keepalives"])
            else:
                frames = _warmed(reply, protocol, turn.persist)
            async for chunk in frames:
                for payload in data_payloads(chunk):
                    await self.send(payload)

    async def _close_when_stopped(self, scope: anyio.CancelScope) -> None:
        await self._stopping.wait()
        protocol = self._protocol
        scope.cancel()
        with anyio.CancelScope(shield=True):
            if protocol is not None:
                for payload in data_payloads(protocol.error(shutting_down())):
                    await self.send(payload)
            await websocket.close(GOING_AWAY, "server shutting down")


def _in_session(decode: Decoder) -> Decoder:
    """`decode`, keyed to the session the upgrade's headers name (`edge/sessions.py`), as an HTTP request is."""
    session = session_key(websocket.headers.get)
    if not session:
        return decode

    def decode_in_session(value: JsonValue) -> GenerationRequest:
        return with_cache_key(decode(value), session)

    return decode_in_session


def _warm_only(turn: ResponsesTurn) -> ResponsesTurn:
    # One token is the least the engine samples; the prefill it follows is what warms the prompt cache.
    params = attrs.evolve(turn.decoded.params, max_tokens=1)
    return attrs.evolve(turn, decoded=attrs.evolve(turn.decoded, params=params))


async def _warmed(reply: Reply, protocol: StreamProtocol, persist: Persist | None) -> AsyncIterator[bytes]:
    """A pre-warm's frames: created, then completed with no output; the sampled token is dropped unseen."""
    yield protocol.start()
    try:
        async for _ in reply:
            pass
        if reply.closed:
            return
        usage = attrs.evolve(reply.summary.usage, completion_tokens=0, reasoning_tokens=0)
        tail = protocol.finish(Summary(finish_reason=FinishReason.STOP, usage=usage))
        if persist is not None:
            await persist(protocol)
    except RequestError as error:
        yield protocol.error(error)
        return
    yield tail
