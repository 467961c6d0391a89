"""The Responses API over WebSocket on `/v1/responses`: the transport the Codex CLI dials first.

One `{"type": "response.create", ...body...}` text frame starts a turn;
each Responses stream event comes back as one text frame holding exactly
its data, the JSON the HTTP route streams as the event's `data:` line
(with its `sequence_number`).
A connection serves turns one after another, as Codex sends them: a
second `response.create` while one is running is refused in-band. The
turn goes through the same preparation (`edge/responses_turn.py`), decoder
chain and submission (`edge/generation.py`) and stream loop
(`edge/streaming.py`) as the HTTP route.

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

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import cast

import anyio
import attrs
import structlog
from quart import Blueprint, Quart, Response, current_app, websocket

from edge import guard
from edge.choice import submit_chosen
from edge.generation import entry_decoder
from edge.keys import key_matches, presented_key
from edge.responses_turn import ResponsesTurn, prepare_turn
from edge.state import Stoppable, app_state, state_of
from edge.streaming import stream_frames
from pipeline.errors import ErrorKind, RequestError, invalid, shutting_down
from pipeline.events import CompletionEvent, FinishReason, Summary
from pipeline.protocol import StreamEvent
from pipeline.requests import JsonObject
from stages.messages import ReadBody, Reply
from stages.prompt.parse import load_json
from wire import openai
from wire.responses import ResponsesStream
from wire.sse import dumps

log = structlog.get_logger(stage="socket")

routes = Blueprint("responses_socket", __name__)

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


def sessions(app: Quart) -> set[Stoppable]:
    return state_of(app).sockets


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
    if app_state().serving is None:
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


@attrs.define(eq=False)
class Session:
    """One socket: its turns one at a time, and what ends them."""

    app: Quart
    turns: int = 0
    _busy: bool = False
    _protocol: ResponsesStream | None = None
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
        idle = state_of(self.app).running.settings.socket_idle_timeout
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
        # The generation entry's decoder chain and submission, as the HTTP route takes them (edge/generation.py);
        # the parse stage takes the frame's body as read here, not read again.
        decode = entry_decoder(turn.decode, websocket.headers.get)
        reply = await submit_chosen(ReadBody(body), request_id=turn.request_id, trace_id=turn.request_id, decode=decode)
        with reply:
            accepted = await reply.accepted()
            protocol = turn.make_protocol(accepted, turn.request_id, reply)
            assert isinstance(protocol, ResponsesStream)
            self._protocol = protocol
            log.info("socket.turn", request_id=turn.request_id, generate=generate)
            persist = partial(turn.persist, protocol) if turn.persist is not None else None
            if generate:
                keepalives = state_of(self.app).running.keepalives
                frames = stream_frames(reply, SocketEvents(protocol), persist, keepalives)
            else:
                frames = _warmed(reply, protocol, persist)
            async for events in frames:
                for event in events:
                    await self.send(event.data)

    async def _close_when_stopped(self, scope: anyio.CancelScope) -> None:
        await self._stopping.wait()
        protocol = self._protocol
        scope.cancel()
        with anyio.CancelScope(shield=True):
            if protocol is not None:
                for event in protocol.error_events(shutting_down()):
                    await self.send(event.data)
            await websocket.close(GOING_AWAY, "server shutting down")


@attrs.frozen
class SocketEvents:
    """A turn's Responses stream as the socket sends it (pipeline/protocol.py's `Framing`): its events, each
    sent as one text frame of its data. No keepalive: the socket has its pings."""

    stream: ResponsesStream

    def start(self) -> list[StreamEvent]:
        return self.stream.start_events()

    def add_events(self, events: Sequence[CompletionEvent]) -> list[StreamEvent]:
        return self.stream.output_events(events)

    def finish(self, summary: Summary) -> list[StreamEvent]:
        return self.stream.finish_events(summary)

    def keepalive(self) -> list[StreamEvent]:
        return []

    def error(self, error: RequestError) -> list[StreamEvent]:
        return self.stream.error_events(error)


def _warm_only(turn: ResponsesTurn) -> ResponsesTurn:
    # One token is the least the engine samples; the prefill it follows is what warms the prompt cache.
    params = attrs.evolve(turn.decoded.params, max_tokens=1)
    return attrs.evolve(turn, decoded=attrs.evolve(turn.decoded, params=params))


async def _warmed(
    reply: Reply, protocol: ResponsesStream, persist: Callable[[], Awaitable[None]] | None
) -> AsyncIterator[list[StreamEvent]]:
    """A pre-warm's events: created, then completed with no output; the sampled token is dropped unseen."""
    yield protocol.start_events()
    try:
        async for _ in reply:
            pass
        if reply.closed:
            return
        usage = attrs.evolve(reply.summary.usage, completion_tokens=0, reasoning_tokens=0)
        tail = protocol.finish_events(Summary(finish_reason=FinishReason.STOP, usage=usage))
        if persist is not None:
            await persist()
    except RequestError as error:
        yield protocol.error_events(error)
        return
    yield tail
