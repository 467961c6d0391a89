"""The one generation entry every generation route takes (docs/STYLE.md, "Thin app").

`generate` takes the request id, the API's decoder and its stream protocol's factory. It submits the raw
body to the model the body names, waits until the request is accepted (so a bad request is still a plain
400, in the API's shape), then streams the reply through the protocol as SSE, or collects it into one JSON
body. The Responses WebSocket takes the same decoder chain (`entry_decoder`) and submission through its own transport.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import cast

from quart import Response, request

from edge import fields, guard
from edge.aliases import with_model
from edge.batch_calls import with_line_priority
from edge.choice import submit_chosen
from edge.disconnect import Client, LastWords, current_client, gone_response
from edge.error_responses import error_parts, json_response
from edge.sessions import session_key
from edge.state import app_state
from edge.streaming import Persist, sse_body
from pipeline.channels import ReplyClosed
from pipeline.errors import shutting_down
from pipeline.protocol import StreamProtocol
from pipeline.requests import Accepted, GenerationRequest, JsonValue, with_cache_key
from stages.messages import Decoder, ReadBody, Reply

# (accepted request, request id, its reply) -> the API's stream protocol.
ProtocolFactory = Callable[[Accepted, str, Reply], StreamProtocol]


def request_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def entry_decoder(decode: Decoder, header: Callable[[str], str | None]) -> Decoder:
    """`decode` as the generation entry runs it, for HTTP and the socket alike: keyed to the session the headers
    name (`edge/sessions.py`; `header` looks one up), its model's name checked (`edge/aliases.py`). The model's
    defaults are applied at submission (`edge/choice.py`'s `submit_chosen`)."""
    session = session_key(header)
    return with_model(_in_session(decode, session) if session else decode)


def _in_session(decode: Decoder, session: str) -> Decoder:
    # A session header names the conversation when the body does not.
    def decode_in_session(value: JsonValue) -> GenerationRequest:
        return with_cache_key(decode(value), session)

    return decode_in_session


async def generate(
    request_id: str,
    decode: Decoder,
    make_protocol: ProtocolFactory,
    *,
    persist: Persist | None = None,
    read: ReadBody | None = None,
) -> Response:
    """Run one generation; `persist` saves the finished result before the client is told it finished.

    `read` is the body as the route has already read it, which the parse stage then takes as it is.
    """
    client = current_client()
    client.last_words = _last_words()
    # Whenever the client goes (socket closed, h2 stream reset), the waits below end and the reply closes.
    with client.while_here():
        return await _generate(client, request_id, decode, make_protocol, persist, read)
    return gone_response()


async def _generate(
    client: Client,
    request_id: str,
    decode: Decoder,
    make_protocol: ProtocolFactory,
    persist: Persist | None,
    read: ReadBody | None,
) -> Response:
    trace_id = guard.trace_id(request_id)
    body = read if read is not None else cast(bytes, await request.get_data(as_text=False))
    # A batch line's request runs at idle priority (edge/batch_calls.py); a socket carries no batch line.
    decode = with_line_priority(entry_decoder(decode, request.headers.get))
    if client.gone:
        return gone_response()
    reply = await submit_chosen(body, request_id=request_id, trace_id=trace_id, decode=decode)
    client.on_gone(reply.close)
    running = app_state().running
    tracing = running.tracing
    if tracing is not None:
        # No await since submit: the request cannot have finished yet.
        tracing.submitted(request_id, route=request.path, trace_id=trace_id, headers=dict(request.headers.items()))
    try:
        accepted = await reply.accepted()
    except BaseException as error:
        reply.close()
        if tracing is not None:
            tracing.forget(request_id)
        if isinstance(error, ReplyClosed):
            return gone_response()
        raise
    # The decoder ran in the parse stage; the fields it left unread are named here, in the route's own task.
    fields.report(accepted.request)
    protocol = make_protocol(accepted, request_id, reply)
    headers = {"x-request-id": trace_id}
    if accepted.request.stream:
        headers["cache-control"] = "no-cache"
        client.last_words = _last_words(stream_tail=lambda: protocol.error(shutting_down()))
        frames = sse_body(reply, protocol, persist, running.keepalives)
        return Response(frames, content_type="text/event-stream", headers=headers)
    with reply:
        events = [event async for batch in reply for event in batch]
    if reply.closed:
        return gone_response()
    result = protocol.body(events, reply.summary)
    if persist is not None:
        await persist(protocol)
    return json_response(result, headers=headers)


def _last_words(stream_tail: Callable[[], bytes] | None = None) -> LastWords:
    """What the request says if the server's graceful timeout cuts it (edge/disconnect.py)."""
    status, body = error_parts(shutting_down())
    return LastWords(status=status, body=body.encode(), stream_tail=stream_tail)
