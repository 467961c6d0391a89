"""The `/v1/responses` answer for a turn with `mcp` tools: the edge's loop (edge/mcp_loop.py), one body or one stream.

The allow-list is checked before anything is called (a server it does not list is a 400 naming the
tool). Unstreamed, the finished items make one response object; streamed, each item's events go out
as it opens, grows and ends (wire/responses_mcp_stream.py), under one run of sequence numbers. Either way
the finished response is stored, as any Responses turn is, before the client is told it finished.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import cast

from quart import Quart, Response, stream_with_context

from edge import guard
from edge.disconnect import current_client, gone_response
from edge.error_responses import json_response
from edge.mcp_loop import McpLoop
from edge.mcp_rounds import app_meter, check_servers
from edge.responses_turn import ResponsesTurn
from pipeline.channels import ReplyClosed
from pipeline.errors import RequestError
from pipeline.events import FinishReason, Summary, Usage
from pipeline.requests import JsonObject, JsonValue
from stages.messages import Reply
from wire import responses as responses_wire
from wire.responses_mcp_stream import McpEvents


async def mcp_response(app: Quart, turn: ResponsesTurn, raw: JsonValue) -> Response:
    """Raises: RequestError (400) for a server the allow-list does not name, or a bad forced tool."""
    check_servers(app, turn.decoded.mcp_servers, param="tools")
    # A sent `x-request-id` only where the guard finds it plain, as every route takes it.
    trace = guard.trace_id(turn.request_id)
    loop = McpLoop(
        decoded=turn.decoded,
        history=turn.history,
        instructions=turn.instructions,
        raw=raw,
        request_id=turn.request_id,
        trace_id=trace,
        meter=app_meter(app),
    )
    headers = {"x-request-id": trace}
    if turn.decoded.stream:
        headers["cache-control"] = "no-cache"
        # The rounds read the request's context (its engine, its client) while the body streams.
        return Response(
            stream_with_context(_stream)(turn, loop, raw), content_type="text/event-stream", headers=headers
        )
    client = current_client()
    with client.while_here():
        try:
            async for _step in loop.steps():
                pass
        except ReplyClosed:
            return gone_response()
        body = _final(turn, loop)
        if turn.decoded.store:
            await turn.save(body)
        return json_response(body, headers=headers)
    return gone_response()


async def _stream(turn: ResponsesTurn, loop: McpLoop, raw: JsonValue) -> AsyncIterator[bytes]:
    events = McpEvents()
    snapshot = _snapshot(turn, raw)
    yield events.opening(snapshot)
    try:
        async for phase, item in loop.steps():
            if phase == "delta":
                yield events.delta(item)
            else:
                yield events.added(item) if phase == "added" else events.done(item)
        body = _final(turn, loop)
        if turn.decoded.store:
            await turn.save(body)
    except ReplyClosed:
        return
    except RequestError as error:
        yield events.failed(
            {**snapshot, "status": "failed", "error": {"code": "server_error", "message": error.message}}
        )
        return
    yield events.closing(body)


def _protocol(turn: ResponsesTurn, loop: McpLoop) -> responses_wire.ResponsesStream:
    assert loop.accepted is not None
    protocol = turn.make_protocol(loop.accepted, turn.request_id, cast(Reply, None))
    assert isinstance(protocol, responses_wire.ResponsesStream)
    return protocol


def _final(turn: ResponsesTurn, loop: McpLoop) -> JsonObject:
    """The response object: the loop's items, the usage of all its rounds."""
    reason = loop.summary.finish_reason if loop.summary is not None else FinishReason.STOP
    body = _protocol(turn, loop).body([], Summary(finish_reason=reason, usage=loop.usage))
    output: list[JsonValue] = list(loop.output)
    body["output"] = output
    body["output_text"] = responses_wire.output_text(output)
    return body


def _snapshot(turn: ResponsesTurn, raw: JsonValue) -> JsonObject:
    """The response as `response.created` shows it, before the model has answered (so named as asked)."""
    model = raw.get("model") if isinstance(raw, dict) else None
    protocol = responses_wire.ResponsesStream(
        id=turn.request_id,
        created_at=int(time.time()),
        model=str(model or ""),
        echo=turn.decoded.echo,
        instructions=turn.instructions,
        previous_response_id=turn.decoded.previous_response_id,
        store=turn.decoded.store,
    )
    body = protocol.body(
        [], Summary(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=0, completion_tokens=0))
    )
    body.pop("usage", None)
    return {**body, "status": "in_progress"}
