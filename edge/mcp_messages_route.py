"""The `/v1/messages` answer with Anthropic's MCP connector: the edge's rounds (edge/mcp_messages_loop.py), one
message or one stream.

The allow-list is checked, and every server listed, before the answer starts: a server the allow-list
does not name, or one whose tools cannot be listed, is a 400 in Anthropic's shape, streamed or not.
Unstreamed, the content made makes one message; streamed, Anthropic's events go out as the content is
made (wire/anthropic.py's `MessagesStream`, one run of block indexes across the rounds), with
`message_start` once the first round is admitted.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from functools import partial

from quart import Quart, Response, stream_with_context

from edge import fields, guard
from edge.disconnect import current_client, gone_response
from edge.error_responses import json_response
from edge.mcp_messages_loop import MessagesMcpLoop
from edge.mcp_rounds import app_meter, check_servers
from pipeline.channels import ReplyClosed
from pipeline.errors import RequestError
from pipeline.events import FinishReason, Summary
from pipeline.requests import JsonValue
from wire.anthropic import MessagesStream
from wire.anthropic_mcp import decode_mcp_messages


async def mcp_message(app: Quart, raw: JsonValue, *, interleaved_thinking: bool) -> Response:
    """Raises: RequestError (400) for a body the connector refuses, a server not allowed or not listed."""
    decode = partial(decode_mcp_messages, interleaved_thinking=interleaved_thinking)
    decoded = fields.decode_here("messages", decode, raw)
    check_servers(app, decoded.servers, param="mcp_servers")
    request_id = f"msg_{uuid.uuid4().hex}"
    trace = guard.trace_id(request_id)
    loop = MessagesMcpLoop(raw=raw, request_id=request_id, trace_id=trace, meter=app_meter(app), request=decoded)
    headers = {"x-request-id": trace}
    client = current_client()
    with client.while_here():
        await loop.prepare()
        if decoded.chat.stream:
            headers["cache-control"] = "no-cache"
            # The rounds read the request's context (its engine, its client) while the body streams.
            return Response(stream_with_context(_stream)(loop), content_type="text/event-stream", headers=headers)
        try:
            async for _step in loop.steps():
                pass
        except ReplyClosed:
            return gone_response()
        return json_response(_protocol(loop).whole(loop.content, _summary(loop), loop.reason), headers=headers)
    return gone_response()


async def _stream(loop: MessagesMcpLoop) -> AsyncIterator[bytes]:
    protocol: MessagesStream | None = None
    try:
        async for step in loop.steps():
            protocol = protocol or _protocol(loop)
            yield protocol.block(step) if isinstance(step, dict) else protocol.add_events([step])
    except ReplyClosed:
        return
    except RequestError as error:
        # Anthropic's stream says a late failure in an `error` event.
        yield (protocol or _protocol(loop)).error(error)
        return
    yield (protocol or _protocol(loop)).finish(_summary(loop), loop.reason)


def _protocol(loop: MessagesMcpLoop) -> MessagesStream:
    """The message's protocol, made once the first round is admitted (its prompt tokens open the stream)."""
    chat = loop.request.chat
    return MessagesStream(
        id=loop.request_id,
        model=chat.model or "",
        input_tokens=loop.accepted.prompt_tokens if loop.accepted is not None else 0,
        omit_thinking=chat.omit_reasoning,
        cached_tokens=loop.cached_tokens,
    )


def _summary(loop: MessagesMcpLoop) -> Summary:
    """The last round's end, with the usage of every round."""
    last = loop.summary
    reason = last.finish_reason if last is not None else FinishReason.STOP
    return Summary(finish_reason=reason, usage=loop.usage, stop_sequence=last.stop_sequence if last else None)
