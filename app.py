"""The HTTP surface: the generation routes, the lifespan, settings (errors are rendered by edge/errors.py).

`hypercorn app:app` serves it. Every generation route is the same three
steps (docs/STYLE.md, "Thin app"): submit the raw body with the API's decoder, wait until the
request is accepted (so a bad request is still a plain 400), then stream
the reply through the API's stream protocol or collect it into one body.
"""

from __future__ import annotations

from pipeline.collector import freeze_imports, pause_for_imports

pause_for_imports()

from stages.models.blas import preload_blas  # noqa: E402

# Before anything imports mlx: the BLAS is chosen when mlx first loads.
BLAS = preload_blas()

import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import AsyncGenerator, Callable  # noqa: E402
from functools import partial  # noqa: E402
from typing import cast  # noqa: E402

import anyio  # noqa: E402
import structlog  # noqa: E402
from quart import Quart, Response, request  # noqa: E402

from edge import fields, guard  # noqa: E402
from edge.admin_routes import routes as admin_routes  # noqa: E402
from edge.aliases import check_aliases, served_as, with_model  # noqa: E402
from edge.audio_routes import routes as audio_routes  # noqa: E402
from edge.background import BackgroundRuns  # noqa: E402
from edge.background_routes import routes as background_routes  # noqa: E402
from edge.background_routes import start_background  # noqa: E402
from edge.batch_calls import with_line_priority  # noqa: E402
from edge.batch_routes import routes as batch_routes  # noqa: E402
from edge.batch_runner import start_batches  # noqa: E402
from edge.choice import chosen, current_engine, model_field, submit_chosen  # noqa: E402
from edge.disconnect import Client, LastWords, WatchClients, current_client, gone_response  # noqa: E402
from edge.errors import error_parts, json_response  # noqa: E402
from edge.errors import install as install_error_handlers  # noqa: E402
from edge.file_routes import routes as file_routes  # noqa: E402
from edge.keepalive import Keepalives  # noqa: E402
from edge.mcp_messages_route import mcp_message  # noqa: E402
from edge.mcp_route import mcp_response  # noqa: E402
from edge.message_batch_routes import routes as message_batch_routes  # noqa: E402
from edge.metrics import Metrics  # noqa: E402
from edge.model_routes import routes as model_work_routes  # noqa: E402
from edge.ollama_routes import ollama_routes  # noqa: E402
from edge.pull_routes import routes as pull_routes  # noqa: E402
from edge.responses_socket import close_all as close_sockets  # noqa: E402
from edge.responses_socket import routes as responses_socket_routes  # noqa: E402
from edge.responses_turn import prepare_turn, stored_response  # noqa: E402
from edge.server_logs import configure_server_logs  # noqa: E402
from edge.sessions import session_key  # noqa: E402
from edge.status_routes import routes as status_routes  # noqa: E402
from edge.streaming import Persist, sse_body  # noqa: E402
from edge.telemetry import Tracing, configure_tracing  # noqa: E402
from edge.web import routes as web_routes  # noqa: E402
from fleet.fleet import Fleet  # noqa: E402
from fleet.spec import specs_from_settings  # noqa: E402
from pipeline.channels import ReplyClosed  # noqa: E402
from pipeline.errors import shutting_down  # noqa: E402
from pipeline.observe import Observers, RequestObserver  # noqa: E402
from pipeline.protocol import StreamProtocol  # noqa: E402
from pipeline.requests import Accepted, ChatRequest, GenerationRequest, JsonValue, with_cache_key  # noqa: E402
from pipeline.settings import Settings  # noqa: E402
from stages.engine.engine import Engine  # noqa: E402
from stages.messages import Decoder, ReadBody, Reply  # noqa: E402
from stages.prompt.parse import load_json  # noqa: E402
from stages.remote.zygote import start_zygote, stop_zygote  # noqa: E402
from store.startup import StartupError, open_response_store  # noqa: E402
from wire import anthropic, openai  # noqa: E402
from wire.anthropic_context import applied_edits_body  # noqa: E402
from wire.anthropic_mcp import connector_beta  # noqa: E402
from wire.anthropic_requests import decode_count_tokens, decode_messages  # noqa: E402
from wire.openai_requests import decode_chat, decode_completion  # noqa: E402
from wire.openapi import document as openapi_document  # noqa: E402
from wire.responses import input_item_resources  # noqa: E402
from wire.responses_items import input_items_page  # noqa: E402

log = structlog.get_logger(stage="http")
# The token histograms' top bucket with several models: past any window a model loaded later may have.
_FLEET_WINDOW = 2**20


app = Quart(__name__)
# Quart's default of 60 s silently cuts any longer stream (docs/STYLE.md, "Thin app").
app.config["RESPONSE_TIMEOUT"] = None
guard.install(app)
install_error_handlers(app)
# Unread request fields named in a header (edge/fields.py).
fields.install(app)
# Sees each request's `http.disconnect` on its way to Quart (edge/disconnect.py: why Quart's cancel is not enough).
app.asgi_app = WatchClients(app.asgi_app)  # type: ignore[method-assign]
# model_work_routes: embeddings, rerank and score, tokenize and detokenize.
for blueprint in (model_work_routes, audio_routes, status_routes, admin_routes, responses_socket_routes, web_routes):
    app.register_blueprint(blueprint)
app.register_blueprint(pull_routes)
app.register_blueprint(background_routes)
# Files and batches (OpenAI's and Anthropic's), run by the lifespan's batch runner.
for blueprint in (file_routes, batch_routes, message_batch_routes):
    app.register_blueprint(blueprint)
# The app is built: what the imports made lives as long as the process (pipeline/collector.py).
freeze_imports()

# (accepted request, request id, its reply) -> the API's stream protocol.
ProtocolFactory = Callable[[Accepted, str, Reply], StreamProtocol]


def engine() -> Engine:
    """The engine of the model this request chose (edge/choice.py)."""
    return current_engine()


@app.while_serving
async def lifespan() -> AsyncGenerator[None, None]:
    settings = Settings.from_env()
    configure_server_logs(settings.log_level, settings.log_format)
    log.info("server.starting", blas=BLAS, max_batch=settings.max_batch, max_pending=settings.max_pending)
    if not settings.model_in_process:
        # Before anything starts a thread (stages/remote/zygote.py).
        start_zygote(settings.worker_fork)
    guard.configure(app, settings)
    try:
        store = await anyio.to_thread.run_sync(open_response_store, settings)
    except StartupError as error:
        # Under `hypercorn app:app` the lifespan failure ends in hypercorn's own traceback; this line comes first.
        log.error("server.cannot_start", reason=str(error))
        raise
    app.extensions["response_store"] = store
    for name in ("web", "socket_idle_timeout", "max_batch", "strict_fields", "mcp_allow"):
        app.extensions[name] = getattr(settings, name)
    keepalives = app.extensions["keepalives"] = Keepalives(settings.keepalive_interval)
    app.extensions["blas"] = BLAS
    metrics = app.extensions["metrics"] = Metrics()
    tracing = app.extensions["tracing"] = configure_tracing()

    def observer(model_name: str) -> RequestObserver:
        measured = metrics.observer(model_name)
        return Observers((measured, tracing)) if tracing is not None else measured

    specs = specs_from_settings(settings)
    several = len(specs) > 1 or settings.models_file is not None
    try:
        async with anyio.create_task_group() as outer:
            outer.start_soon(keepalives.run)
            # Background responses outlive their requests: their runs live here (edge/background.py).
            runs = app.extensions["background_runs"] = BackgroundRuns(app, settings.keepalive_interval)
            await outer.start(runs.run)
            fleet = Fleet(settings=settings, specs=specs, several=several, observer_for=observer)
            app.extensions["fleet"] = await outer.start(fleet.run)
            first = fleet.default.engine if isinstance(fleet.default.engine, Engine) else None
            # With several models the token buckets must hold any model's window, loaded now or later.
            window = _FLEET_WINDOW if several else first.info.context_window if first else 2**15
            metrics.configure(model_names=list(fleet.hosts), context_window=window)
            if not several and first is not None:
                check_aliases(first.served)
            batches = await start_batches(app, settings, outer)
            # Which event loop serves (uvloop under `mlx-relay serve --loop uvloop` or `hypercorn -k uvloop`).
            loop = type(__import__("asyncio").get_running_loop()).__module__
            log.info("server.ready", models=list(fleet.hosts), loop=loop)
            yield
            log.info("server.draining")
            close_sockets(app)
            # Lines still running are cut and run again at the next start (edge/batch_runner.py).
            batches.stop()
            await fleet.drain(settings.drain_timeout)
            outer.cancel_scope.cancel()
    finally:
        stop_zygote()
        await anyio.to_thread.run_sync(store.close)
        if tracing is not None:
            # Flushes the spans still batched.
            await anyio.to_thread.run_sync(tracing.shutdown)
    log.info("server.stopped")


def start_draining() -> None:
    """Refuse new work with 503 from now on (the server has been told to stop); a no-op before the engine is up."""
    if "fleet" in app.extensions:
        cast(Fleet, app.extensions["fleet"]).start_draining()
    # Sockets end their turns and close first, as HTTP drains after (edge/responses_socket.py).
    close_sockets(app)


@app.post("/v1/chat/completions")
async def chat_completions() -> Response:
    return await generate(_request_id("chatcmpl-"), fields.watched("chat", decode_chat), _chat_protocol)


@app.post("/v1/completions")
async def completions() -> Response:
    return await generate(_request_id("cmpl-"), fields.watched("completions", decode_completion), _text_protocol)


def _request_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


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
    session = session_key(request.headers.get)
    if session:
        decode = _with_session(decode, session)
    decode = with_line_priority(with_model(decode))
    if client.gone:
        return gone_response()
    reply = await submit_chosen(body, request_id=request_id, trace_id=trace_id, decode=decode)
    client.on_gone(reply.close)
    tracing = cast(Tracing | None, app.extensions["tracing"])
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
    protocol = make_protocol(accepted, request_id, reply)
    headers = {"x-request-id": trace_id}
    if accepted.request.stream:
        headers["cache-control"] = "no-cache"
        client.last_words = _last_words(stream_tail=lambda: protocol.error(shutting_down()))
        frames = sse_body(reply, protocol, persist, app.extensions["keepalives"])
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


def _chat_protocol(accepted: Accepted, request_id: str, _reply: Reply) -> StreamProtocol:
    return openai.ChatStream(
        id=request_id,
        created=int(time.time()),
        model=served_as(engine().served, accepted.request),
        include_usage=_include_usage(accepted),
    )


def _text_protocol(accepted: Accepted, request_id: str, _reply: Reply) -> StreamProtocol:
    return openai.TextStream(
        id=request_id,
        created=int(time.time()),
        model=served_as(engine().served, accepted.request),
        include_usage=_include_usage(accepted),
    )


def _include_usage(accepted: Accepted) -> bool:
    return accepted.request.include_usage


@app.post("/v1/messages")
async def messages() -> Response:
    betas = request.headers.get("anthropic-beta", "")
    interleaved = "interleaved-thinking-2025-05-14" in (beta.strip() for beta in betas.split(","))
    # Without the beta the decoder refuses `mcp_servers`, naming the header; with it, only a body holding these
    # bytes can name the connector's servers, so no other is parsed here, before the engine.
    if connector_beta(betas) and b"mcp_servers" in (body := cast(bytes, await request.get_data(as_text=False))):
        raw = load_json(body)
        if isinstance(raw, dict) and raw.get("mcp_servers") is not None:
            # Tools the server calls: rounds of generation and MCP calls at the edge (edge/mcp_messages_route.py).
            return await mcp_message(app, raw, interleaved_thinking=interleaved)
    decode = partial(decode_messages, interleaved_thinking=interleaved)
    return await generate(_request_id("msg_"), fields.watched("messages", decode), _messages_protocol)


@app.post("/v1/messages/count_tokens")
async def count_tokens() -> Response:
    body = load_json(cast(bytes, await request.get_data(as_text=False)))
    chat = fields.watched("messages", decode_count_tokens)(body)
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
        model=chat.model or engine().info.name,
        input_tokens=accepted.prompt_tokens,
        context_management=applied_edits_body(accepted.applied_edits) if chat.context_edits else None,
        omit_thinking=chat.omit_reasoning,
        cached_tokens=lambda: reply.cached_tokens,
    )


@app.post("/v1/responses")
async def responses() -> Response:
    raw = load_json(cast(bytes, await request.get_data(as_text=False)))
    turn = await prepare_turn(app, raw, trace_id=request.headers.get("x-request-id"))
    if turn.decoded.background:
        return await start_background(turn, ReadBody(raw))
    if turn.decoded.mcp_servers:
        # Tools the server calls: rounds of generation and MCP calls at the edge (edge/mcp_route.py).
        return await mcp_response(app, turn, raw)
    # Read once: the turn was decoded from `raw` before its store lookup, and the parse stage takes `raw` as read.
    return await generate(turn.request_id, turn.decode, turn.make_protocol, persist=turn.persist, read=ReadBody(raw))


@app.get("/v1/responses/<response_id>/input_items")
async def get_input_items(response_id: str) -> Response:
    stored = await stored_response(app, response_id)
    return json_response(input_items_page(input_item_resources(stored.input_items), request.args))


def _with_session(decode: Decoder, session: str) -> Decoder:
    # A session header names the conversation when the body does not.
    def decode_in_session(value: JsonValue) -> GenerationRequest:
        return with_cache_key(decode(value), session)

    return decode_in_session


@app.get("/openapi.json")
async def openapi() -> Response:
    # Built once, by probing the decoders: off the event loop.
    return json_response(await anyio.to_thread.run_sync(openapi_document))


app.register_blueprint(ollama_routes(generate))
