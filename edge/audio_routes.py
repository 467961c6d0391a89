"""OpenAI's speech-to-text routes: `/v1/audio/transcriptions` and `/v1/audio/translations` (docs/speech.md).

A blueprint `edge/application.py` registers. Each route reads the multipart form,
decodes it (`wire/transcriptions.py`), asks the speech model the body names
(`edge/choice.py`'s `chosen_speech`) and renders the transcript in the
format asked for; errors render through `edge/error_responses.py`'s handlers in OpenAI's shape.
"""

from __future__ import annotations

import uuid

from quart import Blueprint, Response, request

from edge import guard
from edge.choice import chosen_speech
from edge.disconnect import ends_with_client
from pipeline.transcripts import Task
from wire.sse import dumps
from wire.transcriptions import decode_transcription, render

routes = Blueprint("audio", __name__)


@routes.post("/v1/audio/transcriptions")
@ends_with_client
async def transcriptions() -> Response:
    return await _answer(Task.TRANSCRIBE)


@routes.post("/v1/audio/translations")
@ends_with_client
async def translations() -> Response:
    return await _answer(Task.TRANSLATE)


async def _answer(task: Task) -> Response:
    form, files = await request.form, await request.files
    upload = files.get("file")
    file = None if upload is None else (upload.read(), upload.filename or "")
    fields = {name: form.getlist(name) for name in form}
    fields.update({name: ["(a file)"] for name in files if name != "file"})
    decoded = decode_transcription(fields, file, task=task)
    request_id = f"audio-{uuid.uuid4().hex}"
    trace_id = guard.trace_id(request_id)
    async with chosen_speech(decoded.model) as engine:
        transcript = await engine.transcribe(decoded, request_id=request_id, trace_id=trace_id)
    body, media_type = render(transcript, decoded)
    text = body if isinstance(body, str) else dumps(body)
    return Response(text, content_type=media_type, headers={"x-request-id": trace_id})
