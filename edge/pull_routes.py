"""Pulling and removing models over HTTP: `POST /v1/models/pull` (SSE), Ollama's `POST /api/pull` (NDJSON) and
`DELETE /api/delete`, all behind the API key (edge/guard.py keys every path but health and the page).

A pull runs `stages/models/pull.py` in a thread of its own; its events cross to the route through a bounded
channel (docs/STYLE.md, "Bounded channels"), so a slow reader holds the download back rather than piling events
up. A client that goes closes the channel, which ends the pull at its next event and removes what it fetched.
Errors before the stream starts are the API's own (a 400 naming `model`); once it streams, a failure is its last
frame: `{"error": {...}}` then `[DONE]` on the SSE route, Ollama's `{"error": "..."}` on `/api/pull`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import anyio
import anyio.from_thread
import anyio.lowlevel
from quart import Blueprint, Response, request

from pipeline.channels import Channel, open_channel
from pipeline.errors import ErrorKind, RequestError, invalid
from pipeline.requests import JsonObject, JsonValue
from pipeline.settings import Settings
from stages.models.pull import Converting, Fitted, Listed, Progress, Pulled, PullError, PullEvent, Verifying
from stages.models.pull_cache import remove_model
from stages.models.pull_gguf import pull_model
from stages.models.sku import planning_of
from stages.prompt.parse import load_json
from wire.sse import dumps

routes = Blueprint("pulls", __name__)
# Events between the download thread and the route: a few files' progress; the thread waits when it is full.
_EVENTS = 16
# Ollama names a Hugging Face model `hf.co/owner/name[:tag]`.
_HUB_PREFIXES = ("hf.co/", "huggingface.co/")


@routes.post("/v1/models/pull")
async def pull_sse() -> Response:
    """`{"model": "owner/name[:revision]", "force": false}` → SSE: manifest, fit, progress, verifying, success."""
    body = await _body()
    reference, force = _reference(body, keep_prefix=True), body.get("force") is True
    return Response(_sse(_events(reference, force)), content_type="text/event-stream")


@routes.post("/api/pull")
async def pull_ollama() -> Response:
    """Ollama's pull: NDJSON status lines, or with `"stream": false` the last line alone."""
    body = await _body()
    frames = _ndjson(_events(_reference(body, keep_prefix=True), False))
    if body.get("stream") is False:
        last = b""
        async for frame in frames:
            last = frame
        return Response(last, content_type="application/json", status=500 if b'"error"' in last else 200)
    return Response(frames, content_type="application/x-ndjson")


@routes.delete("/api/delete")
async def delete_ollama() -> Response:
    """Ollama's delete: the model leaves the Hugging Face cache; 404 where it is not there."""
    reference = _reference(await _body())
    try:
        await anyio.to_thread.run_sync(remove_model, reference)
    except PullError as error:
        raise RequestError(kind=ErrorKind.NOT_FOUND, message=str(error)) from None
    return Response("", status=200)


async def _body() -> JsonObject:
    value = load_json(cast(bytes, await request.get_data(as_text=False)))
    if not isinstance(value, dict):
        raise invalid("The request body must be a JSON object")
    return value


def _reference(body: JsonObject, *, keep_prefix: bool = False) -> str:
    """The model named; a pull keeps Ollama's `hf.co/` prefix, under which a tag names a GGUF quantization."""
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("'model' must name a Hugging Face repository: 'owner/name[:revision]'", param="model")
    if keep_prefix:
        return name
    for prefix in _HUB_PREFIXES:
        name = name.removeprefix(prefix)
    return name


async def _events(reference: str, force: bool) -> AsyncIterator[PullEvent | PullError]:
    """The pull's events as they happen, ending with `Pulled` or the `PullError` that ended it."""
    channel: Channel[PullEvent | PullError] = open_channel(_EVENTS, name="pull")
    token = anyio.lowlevel.current_token()
    planning = planning_of(Settings.from_env())

    def send(item: PullEvent | PullError) -> None:
        anyio.from_thread.run(channel.send.send, item, token=token)

    def work() -> None:
        try:
            pull_model(reference, on_event=send, planning=planning, force=force)
        except PullError as error:
            send(error)
        finally:
            anyio.from_thread.run_sync(channel.send.close, token=token)

    done = asyncio.get_running_loop().run_in_executor(None, work)
    # Retrieved so a pull its reader left (closed channel, ended pull) is not reported as never retrieved.
    done.add_done_callback(lambda future: future.cancelled() or future.exception())
    with channel.receive:
        async for item in channel.receive:
            yield item


async def _sse(events: AsyncIterator[PullEvent | PullError]) -> AsyncIterator[bytes]:
    async for item in events:
        yield f"data: {dumps(_openai_frame(item))}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _openai_frame(item: PullEvent | PullError) -> JsonValue:
    if isinstance(item, PullError):
        return {"error": {"type": f"{item.kind}_error", "code": item.kind, "message": str(item)}}
    if isinstance(item, Listed):
        manifest = item.manifest
        files: JsonValue = [{"name": file.name, "size": file.size, "digest": file.digest} for file in manifest.files]
        return {"status": "manifest", "model": manifest.repo, "commit": manifest.commit, "files": files}
    if isinstance(item, Fitted):
        fits = item.verdict.fits if item.verdict else None
        return {"status": "fit", "fits": fits, "summary": item.summary}
    if isinstance(item, Progress):
        return {
            "status": "progress",
            "file": item.file.name,
            "completed": item.completed,
            "total": item.file.size,
            "completed_bytes": item.done_bytes,
            "total_bytes": item.total_bytes,
        }
    if isinstance(item, Verifying):
        return {"status": "verifying", "file": item.file.name, "digest": item.file.digest}
    if isinstance(item, Converting):
        return {"status": "converting", "file": item.file.name}
    return {"status": "success", "model": item.manifest.repo, "commit": item.manifest.commit}


async def _ndjson(events: AsyncIterator[PullEvent | PullError]) -> AsyncIterator[bytes]:
    async for item in events:
        frame = _ollama_frame(item)
        if frame is not None:
            yield (dumps(frame) + "\n").encode()


def _ollama_frame(item: PullEvent | PullError) -> JsonValue | None:
    """Ollama's pull lines; the fit has no line of its own there."""
    if isinstance(item, PullError):
        return {"error": str(item)}
    if isinstance(item, Listed):
        return {"status": "pulling manifest"}
    if isinstance(item, Progress):
        digest = item.file.digest
        status = f"pulling {digest.split(':')[-1][:12]}"
        return {"status": status, "digest": digest, "total": item.file.size, "completed": item.completed}
    if isinstance(item, Verifying):
        return {"status": "verifying sha256 digest"}
    if isinstance(item, Converting):
        return {"status": f"converting {item.file.name}"}
    if isinstance(item, Pulled):
        return {"status": "success"}
    return None
