"""The generation routes of the OpenAI and Anthropic APIs, and the OpenAPI document that describes them all.

Each route picks its API's decoder and stream protocol and hands them to the one generation entry
(edge/generation.py): Chat Completions, Completions, Anthropic's Messages, and the Responses API over HTTP
(its turn made ready by edge/responses_turn.py, as the WebSocket's is). A Responses turn with `background`
or `mcp` tools, and a Messages request with the MCP connector's servers, go to their own modules.
"""

from __future__ import annotations

import time
from functools import partial
from typing import cast

import anyio
from quart import Blueprint, Quart, Response, current_app, request

from edge import fields
from edge.aliases import served_as
from edge.background_routes import start_background
from edge.choice import chosen, current_engine, model_field
from edge.error_responses import json_response
from edge.generation import generate, request_id
from edge.mcp_messages_route import mcp_message
from edge.mcp_route import mcp_response
from edge.responses_turn import prepare_turn, stored_response
from pipeline.protocol import StreamProtocol
from pipeline.requests import Accepted, ChatRequest, JsonValue
from stages.messages import ReadBody, Reply
from stages.prompt.parse import load_json
from wire import anthropic, openai
from wire.anthropic_context import applied_edits_body
from wire.anthropic_mcp import connector_beta
from wire.anthropic_requests import decode_count_tokens, decode_messages
from wire.openai_requests import decode_chat, decode_completion
from wire.openapi import document as openapi_document
from wire.responses_items import input_item_resources, input_items_page

routes = Blueprint("generation", __name__)


@routes.post("/v1/chat/completions")
async def chat_completions() -> Response:
    return await generate(request_id("chatcmpl-"), fields.watched("chat", decode_chat), _chat_protocol)


@routes.post("/v1/completions")
async def completions() -> Response:
    return await generate(request_id("cmpl-"), fields.watched("completions", decode_completion), _text_protocol)


def _openai_protocol(
    stream: type[openai.ChatStream] | type[openai.TextStream], accepted: Accepted, request_id: str, _reply: Reply
) -> StreamProtocol:
    return stream(
        id=request_id,
        created=int(time.time()),
        model=served_as(current_engine().served, accepted.request),
        include_usage=accepted.request.include_usage,
    )


_chat_protocol = partial(_openai_protocol, openai.ChatStream)
_text_protocol = partial(_openai_protocol, openai.TextStream)


@routes.post("/v1/messages")
async def messages() -> Response:
    betas = request.headers.get("anthropic-beta", "")
    interleaved = "interleaved-thinking-2025-05-14" in (beta.strip() for beta in betas.split(","))
    # Without the beta the decoder refuses `mcp_servers`, naming the header; with it, only a body holding these
    # bytes can name the connector's servers, so no other is parsed here, before the engine.
    if connector_beta(betas) and b"mcp_servers" in (body := cast(bytes, await request.get_data(as_text=False))):
        raw = load_json(body)
        if isinstance(raw, dict) and raw.get("mcp_servers") is not None:
            # Tools the server calls: rounds of generation and MCP calls at the edge (edge/mcp_messages_route.py).
            return await mcp_message(_app(), raw, interleaved_thinking=interleaved)
    decode = partial(decode_messages, interleaved_thinking=interleaved)
    return await generate(request_id("msg_"), fields.watched("messages", decode), _messages_protocol)


@routes.post("/v1/messages/count_tokens")
async def count_tokens() -> Response:
    body = load_json(cast(bytes, await request.get_data(as_text=False)))
    chat = fields.decode_here("messages", decode_count_tokens, body)
    async with chosen(model_field(body)) as chosen_engine:
        # An adapter shares the base model's tokenizer; an unknown model is still a 404.
        chosen_engine.served.adapter_of(body)
        counted = await chosen_engine.count_tokens(chat)
    reply: dict[str, JsonValue] = {"input_tokens": counted.input_tokens}
    if counted.original_input_tokens is not None:
        # Anthropic's report when context management was asked: the count before the edits.
        reply["context_management"] = {"original_input_tokens": counted.original_input_tokens}
    return json_response(reply)


def _messages_protocol(accepted: Accepted, request_id: str, reply: Reply) -> StreamProtocol:
    chat = accepted.request
    assert isinstance(chat, ChatRequest)
    return anthropic.MessagesStream(
        id=request_id,
        # Any model name is served by the one model, and echoed as asked (clients check it).
        model=chat.model or current_engine().info.name,
        input_tokens=accepted.prompt_tokens,
        context_management=applied_edits_body(accepted.applied_edits) if chat.context_edits else None,
        omit_thinking=chat.omit_reasoning,
        cached_tokens=lambda: reply.cached_tokens,
    )


@routes.post("/v1/responses")
async def responses() -> Response:
    raw = load_json(cast(bytes, await request.get_data(as_text=False)))
    turn = await prepare_turn(_app(), raw, trace_id=request.headers.get("x-request-id"))
    if turn.decoded.background:
        return await start_background(turn, ReadBody(raw))
    if turn.decoded.mcp_servers:
        # Tools the server calls: rounds of generation and MCP calls at the edge (edge/mcp_route.py).
        return await mcp_response(_app(), turn, raw)
    # Read once: the turn was decoded from `raw` before its store lookup, and the parse stage takes `raw` as read.
    return await generate(turn.request_id, turn.decode, turn.make_protocol, persist=turn.persist, read=ReadBody(raw))


@routes.get("/v1/responses/<response_id>/input_items")
async def get_input_items(response_id: str) -> Response:
    stored = await stored_response(_app(), response_id)
    return json_response(input_items_page(input_item_resources(stored.input_items), request.args))


@routes.get("/openapi.json")
async def openapi() -> Response:
    # Built once, by probing the decoders: off the event loop.
    return json_response(await anyio.to_thread.run_sync(openapi_document))


def _app() -> Quart:
    # The app itself, not the proxy: a stream's persist hook and the MCP rounds keep it past the request's context.
    return cast(Quart, current_app._get_current_object())  # type: ignore[attr-defined]
