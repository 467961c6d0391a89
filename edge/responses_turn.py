"""One Responses turn made ready to generate: the same for the HTTP route and the WebSocket.

The body is decoded and validated first (a bad body is a 400 before any
store lookup), then `previous_response_id` is resolved against the store
and spliced in. What is left is the generation entry's three inputs: the
decoder, the stream protocol and the hook that saves the finished turn.
"""

from __future__ import annotations

import time
import uuid

import attrs
import structlog
from quart import Quart

from edge import fields
from edge.aliases import served_as
from edge.choice import current_engine
from edge.owners import caller, visible
from edge.state import state_of
from edge.store import store_call
from edge.streaming import Persist
from pipeline.errors import ErrorKind, RequestError
from pipeline.protocol import StreamProtocol
from pipeline.requests import Accepted, ChatRequest, JsonObject, JsonValue
from stages.messages import Reply
from store.response_store import StoredResponse
from wire import responses as responses_wire
from wire.responses_requests import ResponsesRequest, continued_input, decode_responses, to_chat

log = structlog.get_logger(stage="http")


@attrs.frozen(kw_only=True)
class ResponsesTurn:
    request_id: str
    decoded: ResponsesRequest
    history: tuple[JsonObject, ...]
    instructions: str | None
    app: Quart
    # The caller's key fingerprint (edge/owners.py), kept with the stored response.
    owner: str | None = None

    @property
    def replay(self) -> tuple[JsonObject, ...]:
        """The conversation this turn answers, as the store keeps it for the next turn."""
        return (*self.history, *self.decoded.input)

    def decode(self, _body: JsonValue) -> ChatRequest:
        # The body was validated by `prepare_turn`, before the store lookup; only the splice is left.
        return to_chat(self.decoded, self.history, self.instructions)

    def make_protocol(self, accepted: Accepted, request_id: str, _reply: Reply) -> StreamProtocol:
        engine = current_engine()
        return responses_wire.ResponsesStream(
            id=request_id,
            created_at=int(time.time()),
            model=served_as(engine.served, accepted.request),
            echo=self.decoded.echo,
            instructions=self.instructions,
            previous_response_id=self.decoded.previous_response_id,
            store=self.decoded.store,
            tool_specs=self.decoded.tool_specs,
            grammar_call=self.decoded.grammar_call,
        )

    @property
    def persist(self) -> Persist | None:
        return self._persist if self.decoded.store else None

    async def _persist(self, protocol: StreamProtocol) -> None:
        assert isinstance(protocol, responses_wire.ResponsesStream) and protocol.final is not None
        await self.save(protocol.final)

    async def save(self, body: JsonObject) -> None:
        record = StoredResponse(
            id=self.request_id,
            created_at=time.time(),
            body=body,
            input_items=self.replay,
            instructions=self.instructions,
            owner=self.owner,
        )
        await store_call(state_of(self.app).running.response_store, lambda store: store.put(record))


async def prepare_turn(app: Quart, raw: JsonValue, *, trace_id: str | None) -> ResponsesTurn:
    """Raises: RequestError for a bad body or a `previous_response_id` the store does not hold."""
    decoded = fields.decode_here("responses", decode_responses, raw)
    history: tuple[JsonObject, ...] = ()
    instructions = decoded.instructions
    if decoded.previous_response_id is not None:
        previous = await stored_response(app, decoded.previous_response_id, param="previous_response_id")
        history = continued_input(previous.input_items, _list(previous.body.get("output")))
        instructions = decoded.instructions if decoded.instructions is not None else previous.instructions
    request_id = f"resp_{uuid.uuid4().hex}"
    if decoded.skipped_tools:
        # Hosted tools run on OpenAI's side; this server offers the model the others.
        log.info("request.hosted_tools_skipped", trace_id=trace_id or request_id, tools=list(decoded.skipped_tools))
    return ResponsesTurn(
        request_id=request_id,
        decoded=decoded,
        history=history,
        instructions=instructions,
        app=app,
        owner=caller(),
    )


async def stored_response(app: Quart, response_id: str, *, param: str | None = None) -> StoredResponse:
    stored = await store_call(state_of(app).running.response_store, lambda store: store.get(response_id))
    if stored is None or not visible(stored):
        raise response_not_found(response_id, param=param)
    return stored


def response_not_found(response_id: str, *, param: str | None) -> RequestError:
    return RequestError(
        kind=ErrorKind.NOT_FOUND,
        message=f"Response with id '{response_id}' not found.",
        param=param,
        code="previous_response_not_found" if param else None,
    )


def _list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []
