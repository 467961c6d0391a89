"""OpenAI's audio transcriptions and translations: the multipart form to a request, a transcript to a reply.

`POST /v1/audio/transcriptions` and `/v1/audio/translations` take a
multipart form (`file`, `model`, `language`, `prompt`, `temperature`,
`response_format`, `timestamp_granularities[]`). Every field is read or
refused by name: the ones that change output and are not served
(`stream`, `include[]` logprobs, chunking, diarization, keywords) are a 400
naming them, as is any field OpenAI does not have for the endpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pipeline.errors import invalid
from pipeline.requests import JsonObject
from pipeline.transcripts import ResponseFormat, Task, Transcript, TranscriptionRequest
from wire.subtitles import srt, vtt

_COMMON = {"file", "model", "prompt", "response_format", "temperature"}
_TRANSCRIPTION_ONLY = {"language", "timestamp_granularities", "stream"}
# OpenAI's fields this server does not serve, each refused by name (they change the output).
_NOT_SERVED = {
    "include": "log probabilities ('include[]') are not served for Whisper models",
    "chunking_strategy": "'chunking_strategy' is not served: Whisper's 30-second windows are used",
    "known_speaker_names": "speaker diarization is not served",
    "known_speaker_references": "speaker diarization is not served",
    "keywords": "'keywords' is not served",
    "languages": "'languages' is not served; give one 'language'",
}
_GRANULARITIES = ("word", "segment")


def decode_transcription(
    form: Mapping[str, Sequence[str]], file: tuple[bytes, str] | None, *, task: Task
) -> TranscriptionRequest:
    """The request a form asks for; `file` is the uploaded file's bytes and name, if any.

    Raises:
        RequestError: 400 naming the field that is missing, malformed or not served.
    """
    fields = {name.removesuffix("[]"): values for name, values in form.items()}
    _refuse_unknown(fields, task)
    if file is None:
        raise invalid("'file' is required: the audio to transcribe, as a multipart file", param="file")
    model = _one(fields, "model")
    if not model:
        raise invalid("'model' is required", param="model")
    response_format = _format(_one(fields, "response_format"))
    granularities = tuple(fields.get("timestamp_granularities", ()))
    for granularity in granularities:
        if granularity not in _GRANULARITIES:
            raise invalid(
                f"'timestamp_granularities[]' {granularity!r} is not one of word, segment",
                param="timestamp_granularities",
            )
    if granularities and response_format is not ResponseFormat.VERBOSE_JSON:
        raise invalid(
            "'timestamp_granularities[]' needs 'response_format' verbose_json", param="timestamp_granularities"
        )
    stream = _one(fields, "stream")
    if stream is not None and stream.lower() not in ("false", "0"):
        raise invalid(
            "'stream' is not served for Whisper models; send the request without it",
            param="stream",
            code="unsupported_parameter",
        )
    return TranscriptionRequest(
        audio=file[0],
        filename=file[1],
        model=model,
        task=task,
        language=_one(fields, "language") or None,
        prompt=_one(fields, "prompt") or None,
        temperature=_temperature(_one(fields, "temperature")),
        response_format=response_format,
        words="word" in granularities,
        segments=response_format is ResponseFormat.VERBOSE_JSON and (not granularities or "segment" in granularities),
    )


def audio_form(*, translations: bool) -> JsonObject:
    """The form's schema, for the OpenAPI description."""
    text: JsonObject = {"type": "string"}
    properties: JsonObject = {
        "file": {"type": "string", "format": "binary"},
        "model": text,
        "prompt": text,
        "response_format": {"type": "string", "enum": [item.value for item in ResponseFormat]},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    }
    if not translations:
        granularities: JsonObject = {"type": "array", "items": {"type": "string", "enum": list(_GRANULARITIES)}}
        properties.update(language=text, **{"timestamp_granularities[]": granularities})
    return {"type": "object", "required": ["file", "model"], "properties": properties}


def _refuse_unknown(fields: Mapping[str, Sequence[str]], task: Task) -> None:
    known = _COMMON | (_TRANSCRIPTION_ONLY if task is Task.TRANSCRIBE else set())
    for name in fields:
        if name in _NOT_SERVED:
            raise invalid(_NOT_SERVED[name], param=name, code="unsupported_parameter")
        if name not in known:
            where = "transcriptions" if task is Task.TRANSCRIBE else "translations"
            raise invalid(f"Unrecognized request argument supplied: {name} (audio {where})", param=name)


def _one(fields: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = fields.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise invalid(f"'{name}' is given {len(values)} times; give it once", param=name)
    return values[0]


def _format(value: str | None) -> ResponseFormat:
    if value is None:
        return ResponseFormat.JSON
    try:
        return ResponseFormat(value)
    except ValueError:
        names = ", ".join(item.value for item in ResponseFormat)
        raise invalid(f"'response_format' {value!r} is not one of {names}", param="response_format") from None


def _temperature(value: str | None) -> float | None:
    if value is None or value == "":
        return None
    try:
        temperature = float(value)
    except ValueError:
        raise invalid(f"'temperature' must be a number, not {value!r}", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise invalid("'temperature' must be between 0 and 1", param="temperature")
    return temperature


def render(transcript: Transcript, request: TranscriptionRequest) -> tuple[JsonObject | str, str]:
    """The reply's body and media type in the request's `response_format`."""
    match request.response_format:
        case ResponseFormat.TEXT:
            return transcript.text + "\n", "text/plain; charset=utf-8"
        case ResponseFormat.SRT:
            return srt(transcript.segments), "text/plain; charset=utf-8"
        case ResponseFormat.VTT:
            return vtt(transcript.segments), "text/vtt; charset=utf-8"
        case ResponseFormat.VERBOSE_JSON:
            return verbose(transcript, request), "application/json"
        case _:
            return {"text": transcript.text, "usage": _usage(transcript)}, "application/json"


def verbose(transcript: Transcript, request: TranscriptionRequest) -> JsonObject:
    body: JsonObject = {
        "task": request.task.value,
        # A translation's is the output's, always English (OpenAI's TranslationVerbose).
        "language": transcript.language if request.task is Task.TRANSCRIBE else "english",
        "duration": transcript.duration,
        "text": transcript.text,
    }
    if request.words:
        body["words"] = [{"word": word.word, "start": word.start, "end": word.end} for word in transcript.words]
    if request.segments:
        body["segments"] = [
            {
                "id": segment.id,
                "seek": segment.seek,
                "start": segment.start,
                "end": segment.end,
                "text": segment.text,
                "tokens": list(segment.tokens),
                "temperature": segment.temperature,
                "avg_logprob": segment.avg_logprob,
                "compression_ratio": segment.compression_ratio,
                "no_speech_prob": segment.no_speech_prob,
            }
            for segment in transcript.segments
        ]
    body["usage"] = _usage(transcript)
    return body


def _usage(transcript: Transcript) -> JsonObject:
    """OpenAI bills Whisper by the second of audio, rounded up."""
    return {"type": "duration", "seconds": math.ceil(transcript.duration)}
