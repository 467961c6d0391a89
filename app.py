"""The HTTP surface: routes, lifespan, error rendering, settings.

`hypercorn app:app` serves it. Every generation route is the same three
steps (S23): submit the raw body with the API's decoder, wait until the
request is accepted (so a bad request is still a plain 400), then stream
the reply through the API's stream protocol or collect it into one body.
"""

from __future__ import annotations

from stages.blas import preload_blas

# Before anything imports mlx: the BLAS is chosen when mlx first loads.
BLAS = preload_blas()

import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import AsyncGenerator, AsyncIterator, Callable  # noqa: E402
from typing import cast  # noqa: E402

import anyio  # noqa: E402
import attrs  # noqa: E402
import structlog  # noqa: E402
from quart import Quart, Response, request  # noqa: E402
from werkzeug.exceptions import HTTPException  # noqa: E402

from pipeline.errors import ErrorKind, RequestError  # noqa: E402
from pipeline.protocol import StreamProtocol  # noqa: E402
from pipeline.requests import Accepted, JsonObject, JsonValue  # noqa: E402
from pipeline.settings import Settings  # noqa: E402
from pipeline.tracing import configure_logging  # noqa: E402
from stages.engine import Engine  # noqa: E402
from stages.messages import Decoder, Reply  # noqa: E402
from stages.parse import load_json  # noqa: E402
from wire import anthropic, openai  # noqa: E402
from wire.anthropic_requests import decode_count_tokens, decode_messages  # noqa: E402
from wire.openai_requests import decode_chat, decode_completion  # noqa: E402
from wire.sse import dumps  # noqa: E402

log = structlog.get_logger(stage="http")

app = Quart(__name__)
# Quart's default of 60 s silently cuts any longer stream (STYLE.md S23).
app.config["RESPONSE_TIMEOUT"] = None

ProtocolFactory = Callable[[Accepted, str], StreamProtocol]


def engine() -> Engine:
    return cast(Engine, app.extensions["engine"])


@app.while_serving
async def lifespan() -> AsyncGenerator[None, None]:
    settings = Settings.from_env()
    configure_logging(settings.log_level)
    log.info("server.starting", blas=BLAS, max_batch=settings.max_batch, max_pending=settings.max_pending)
    async with anyio.create_task_group() as outer:
        app.extensions["engine"] = await outer.start(Engine(settings=settings).run)
        log.info("server.ready", model=engine().info.name)
        yield
        log.info("server.draining")
        await engine().drain(settings.drain_timeout)
        outer.cancel_scope.cancel()
    log.info("server.stopped")


@app.post("/v1/chat/completions")
async def chat_completions() -> Response:
    return await generate("chatcmpl", decode_chat, _chat_protocol)


@app.post("/v1/completions")
async def completions() -> Response:
    return await generate("cmpl", decode_completion, _text_protocol)


async def generate(prefix: str, decode: Decoder, make_protocol: ProtocolFactory) -> Response:
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    trace_id = request.headers.get("x-request-id") or request_id
    body = cast(bytes, await request.get_data(as_text=False))
    reply = await engine().submit(request_id=request_id, trace_id=trace_id, body=body, decode=decode)
    try:
        accepted = await reply.accepted()
    except BaseException:
        reply.close()
        raise
    generation = accepted.request
    protocol = make_protocol(accepted, request_id)
    headers = {"x-request-id": trace_id}
    if generation.stream:
        headers["cache-control"] = "no-cache"
        return Response(sse_body(reply, protocol), content_type="text/event-stream", headers=headers)
    with reply:
        events = [event async for batch in reply for event in batch]
    return json_response(protocol.body(events, reply.summary), headers=headers)


async def sse_body(reply: Reply, protocol: StreamProtocol) -> AsyncIterator[bytes]:
    with reply:
        yield protocol.start()
        try:
            async for events in reply:
                yield protocol.add_events(events)
        except RequestError as error:
            yield protocol.error(error)
            return
        yield protocol.finish(reply.summary)


def _chat_protocol(accepted: Accepted, request_id: str) -> StreamProtocol:
    return openai.ChatStream(
        id=request_id, created=int(time.time()), model=engine().info.name, include_usage=_include_usage(accepted)
    )


def _text_protocol(accepted: Accepted, request_id: str) -> StreamProtocol:
    return openai.TextStream(
        id=request_id, created=int(time.time()), model=engine().info.name, include_usage=_include_usage(accepted)
    )


def _include_usage(accepted: Accepted) -> bool:
    return accepted.request.include_usage


@app.post("/v1/messages")
async def messages() -> Response:
    return await generate("msg", decode_messages, _messages_protocol)


@app.post("/v1/messages/count_tokens")
async def count_tokens() -> Response:
    chat = decode_count_tokens(load_json(cast(bytes, await request.get_data(as_text=False))))
    return json_response({"input_tokens": await engine().count_tokens(chat)})


def _messages_protocol(accepted: Accepted, request_id: str) -> StreamProtocol:
    return anthropic.MessagesStream(
        id=f"msg_{request_id.removeprefix('msg-')}", model=engine().info.name, input_tokens=accepted.prompt_tokens
    )


@app.get("/v1/models")
async def models() -> Response:
    return json_response({"object": "list", "data": [_model_card()]})


@app.get("/v1/models/<path:model_id>")
async def model(model_id: str) -> Response:
    if model_id != engine().info.name:
        raise RequestError(kind=ErrorKind.NOT_FOUND, message=f"The model '{model_id}' does not exist", param="model")
    return json_response(_model_card())


def _model_card() -> JsonObject:
    info = engine().info
    return {
        "id": info.name,
        "object": "model",
        "created": 0,
        "owned_by": "mlx-relay",
        "context_window": info.context_window,
        "max_model_len": info.context_window,
    }


@app.get("/health")
async def health() -> Response:
    current = engine()
    status = "ok" if current.ready else ("dead" if current.dead else "unavailable")
    return json_response({"status": status}, status=200 if status == "ok" else 503)


@app.get("/stats")
async def stats() -> Response:
    current = engine()
    snapshot = attrs.asdict(current.statistics())
    return json_response({"model": current.info.name, "blas": BLAS, **snapshot})


@app.errorhandler(RequestError)
async def request_error(error: RequestError) -> Response:
    return error_response(error)


@app.errorhandler(HTTPException)
async def http_error(error: HTTPException) -> Response:
    kind = {404: ErrorKind.NOT_FOUND, 405: ErrorKind.METHOD_NOT_ALLOWED}.get(error.code or 500, ErrorKind.INVALID_REQUEST)
    return error_response(RequestError(kind=kind, message=f"{request.method} {request.path}: {error.name}"))


@app.errorhandler(Exception)
async def unexpected_error(error: Exception) -> Response:
    log.error("http.unexpected_error", path=request.path, exc_info=error)
    return error_response(RequestError(kind=ErrorKind.INTERNAL, message="Internal server error"))


def error_response(error: RequestError) -> Response:
    """The error in the shape of the API the client called."""
    headers = {"retry-after": str(max(1, round(error.retry_after)))} if error.retry_after is not None else {}
    if request.path.startswith("/v1/messages"):
        return json_response(anthropic.error_body(error), status=anthropic.error_status(error), headers=headers)
    return json_response(openai.error_body(error), status=error.status, headers=headers)


def json_response(body: JsonValue, *, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(body), status=status, content_type="application/json", headers=headers)
