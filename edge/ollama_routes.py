"""Ollama's API under `/api/`: chat and generate through the same generation entry as the other APIs,
embeddings through the same model work, and the model reports (tags, show, ps, version) from the fleet.

Generation goes through the one entry, edge/generation.py's `generate`. Errors render in Ollama's shape
through the app's error handlers (edge/error_responses.py: the path says which API). `keep_alive` is applied to the
fleet after the request is handed over: `0` drains and unloads the model once its requests finish, a duration
unloads it once it has been idle that long, and `-1` (any negative) keeps it: a no-op for a model the fleet
never unloads on its own, and a 400 naming `keep_alive` for one the models file gives a `ttl`, which this
request cannot lift.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import cast

import anyio
from quart import Blueprint, Response, current_app, request

from edge import fields, guard
from edge.choice import chosen, current_engine, fleet, model_field
from edge.disconnect import ends_with_client
from edge.error_responses import json_response
from edge.generation import generate
from fleet.fleet import Fleet
from fleet.model_host import ModelHost, State
from pipeline.errors import invalid
from pipeline.protocol import StreamProtocol
from pipeline.requests import Accepted
from stages.engine.engine import Engine
from stages.messages import ReadBody, Reply
from stages.prompt.parse import load_json
from wire import ollama
from wire.field_reads import as_body
from wire.ollama_models import (
    OLLAMA_VERSION,
    ModelFacts,
    decode_ollama_embed,
    embed_body,
    ps_body,
    show_body,
    tags_body,
)
from wire.ollama_requests import (
    decode_ollama_chat,
    decode_ollama_generate,
    defaults_view,
    is_load_only,
    num_ctx,
    read_keep_alive,
)

NDJSON = "application/x-ndjson"


def ollama_routes() -> Blueprint:
    routes = Blueprint("ollama", __name__)

    @routes.post("/api/chat")
    async def chat() -> Response:
        return await _generation(chat=True)

    @routes.post("/api/generate")
    async def generate_route() -> Response:
        return await _generation(chat=False)

    for path, handler in _REPORTS.items():
        routes.route(path, methods=["POST"] if path in _POSTED else ["GET"])(handler)
    return routes


async def _generation(*, chat: bool) -> Response:
    arrived = time.time_ns()
    raw = as_body(load_json(cast(bytes, await request.get_data(as_text=False))))
    keep_alive = read_keep_alive(raw)
    model = model_field(raw)
    if (not raw.get("messages")) if chat else is_load_only(raw):
        return await _load_only(model, keep_alive, chat=chat)
    apply_keep_alive = _keep_alive(model, keep_alive)
    limit = num_ctx(raw)

    def make_protocol(accepted: Accepted, _request_id: str, reply: Reply) -> StreamProtocol:
        if limit is not None and accepted.prompt_tokens > limit:
            reply.close()
            message = f"the prompt is {accepted.prompt_tokens} tokens, past 'options.num_ctx' ({limit})"
            raise invalid(message, param="options.num_ctx")
        name = accepted.request.model or current_engine().info.name
        return ollama.OllamaStream(model=name, chat=chat, arrived_ns=arrived)

    decode = decode_ollama_chat if chat else decode_ollama_generate
    watched = fields.watched("ollama_chat" if chat else "ollama_generate", decode)
    request_id = f"ollama-{uuid.uuid4().hex}"
    response = await generate(request_id, watched, make_protocol, read=ReadBody(defaults_view(raw)))
    if response.mimetype == "text/event-stream":
        # The generation entry streams SSE; the bytes are the protocol's NDJSON lines, so only the type changes.
        response.mimetype = NDJSON
    apply_keep_alive()
    return response


async def _load_only(model: str | None, keep_alive: float | None, *, chat: bool) -> Response:
    apply_keep_alive = _keep_alive(model, keep_alive)
    async with chosen(model) as engine:
        name = model or engine.info.name
    apply_keep_alive()
    reply = ollama.load_reply(name, unloaded=keep_alive == 0)
    if chat:
        reply = {key: value for key, value in reply.items() if key != "response"}
        reply["message"] = {"role": "assistant", "content": ""}
    return json_response(reply)


def _keep_alive(model: str | None, seconds: float | None) -> Callable[[], None]:
    """Check `keep_alive` now (a 400 before anything runs) and return what applies it once the request is handed
    over: in the background, since the reply may still be streaming."""
    if seconds is None:
        return lambda: None
    host = fleet().host_named(model)
    if math.isinf(seconds):
        if host.spec.ttl is not None and not host.spec.pinned:
            ttl = host.spec.ttl
            raise invalid(f"'keep_alive': the models file unloads this model after {ttl:g} s idle", param="keep_alive")
        return lambda: None
    current = fleet()
    return lambda: current_app.add_background_task(_unload_when_idle, current, host, seconds)


async def _unload_when_idle(current: Fleet, host: ModelHost, seconds: float) -> None:
    """Unload `host` once it has been idle `seconds` (0: as soon as its requests finish, a drain)."""
    if seconds > 0:
        await anyio.sleep(seconds)
        # A later request used it: that request's own keep_alive (or none) decides now.
        if host.busy or time.monotonic() - host.last_used < seconds or host.state is not State.READY:
            return
    await current.unload(host.name, graceful=True)


@ends_with_client
async def _embed() -> Response:
    return await _embedding(legacy=False)


@ends_with_client
async def _embeddings() -> Response:
    return await _embedding(legacy=True)


async def _embedding(*, legacy: bool) -> Response:
    arrived = time.time_ns()
    raw = as_body(load_json(cast(bytes, await request.get_data(as_text=False))))
    decoded = fields.decode_here("ollama_embed", decode_ollama_embed, raw)
    apply_keep_alive = _keep_alive(decoded.model, read_keep_alive(raw))
    request_id = f"embd-{uuid.uuid4().hex}"
    async with chosen(decoded.model) as engine:
        work = engine.model_work(decoded.model)
        result = await work.embed(decoded, request_id=request_id, trace_id=guard.trace_id(request_id))
    apply_keep_alive()
    if legacy:
        return json_response({"embedding": list(result.vectors[0])})
    return json_response(embed_body(result, model=decoded.model or work.name, total_ns=time.time_ns() - arrived))


async def _tags() -> Response:
    return json_response(tags_body([_facts(host, name) for name, host in _names()]))


async def _ps() -> Response:
    loaded = [(name, host) for name, host in _names() if host.state is State.READY and name == host.name]
    return json_response(ps_body([_facts(host, name) for name, host in loaded]))


async def _show() -> Response:
    raw = as_body(load_json(cast(bytes, await request.get_data(as_text=False))))
    name = model_field(raw) or model_field({"model": raw.get("name")})
    if name is None:
        raise invalid("'model' is required", param="model")
    async with chosen(name):
        host = fleet().host_named(name)
        return json_response(show_body(_facts(host, name)))


async def _version() -> Response:
    return json_response({"version": OLLAMA_VERSION})


_REPORTS: dict[str, Callable[[], Awaitable[Response]]] = {
    "/api/tags": _tags,
    "/api/ps": _ps,
    "/api/show": _show,
    "/api/version": _version,
}
_REPORTS |= {"/api/embed": _embed, "/api/embeddings": _embeddings}
_POSTED = frozenset({"/api/show", "/api/embed", "/api/embeddings"})


def _names() -> list[tuple[str, ModelHost]]:
    """Every name a client may ask by, with the model that answers it."""
    current = fleet()
    return [(asked, current.hosts[owner]) for asked, owner in current.known_names().items()]


def _facts(host: ModelHost, name: str) -> ModelFacts:
    engine = host.engine if isinstance(host.engine, Engine) else None
    expires = None if host.spec.ttl is None else ollama.created_at(_expiry_ns(host, host.spec.ttl))
    size = host.footprint.bytes if host.footprint is not None else 0
    if engine is None:
        return ModelFacts(name=name, size=size, expires_at=expires)
    return ModelFacts(
        name=name,
        size=size,
        family=engine.family.name,
        context_length=engine.info.context_window,
        capabilities=_capabilities(engine),
        template=str(getattr(engine.tokenizer, "chat_template", None) or ""),
        parameters=host.defaults.shown(),
        expires_at=expires,
    )


def _expiry_ns(host: ModelHost, ttl: float) -> int:
    return time.time_ns() + int(host.ttl_left(ttl) * 1e9)


def _capabilities(engine: Engine) -> tuple[str, ...]:
    found = ["completion", "tools"]
    if engine.family.think is not None:
        found.append("thinking")
    if engine.work.vision is not None:
        found.append("vision")
    if engine.embedder is not None:
        found.append("embedding")
    return tuple(found)
