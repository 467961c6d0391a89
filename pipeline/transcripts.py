"""Speech to text: a transcription or translation request and its transcript, API-neutral.

A `wire/` decoder builds the request from OpenAI's multipart form; the
speech stages decode its audio and run the model; `wire/` renders the
transcript in the response format asked for.
"""

from __future__ import annotations

import enum

import attrs


class Task(enum.Enum):
    TRANSCRIBE = "transcribe"
    # Whisper's translation: English text from speech in any language.
    TRANSLATE = "translate"


class ResponseFormat(enum.Enum):
    JSON = "json"
    TEXT = "text"
    SRT = "srt"
    VTT = "vtt"
    VERBOSE_JSON = "verbose_json"


@attrs.frozen(kw_only=True)
class TranscriptionRequest:
    audio: bytes
    filename: str
    model: str | None
    task: Task = Task.TRANSCRIBE
    # ISO-639-1; None: detected from the first 30 seconds.
    language: str | None = None
    prompt: str | None = None
    # None: Whisper's fallback from 0 upwards when a window decodes badly (what OpenAI does for 0).
    temperature: float | None = None
    response_format: ResponseFormat = ResponseFormat.JSON
    words: bool = False
    segments: bool = False


@attrs.frozen(kw_only=True)
class Word:
    word: str
    start: float
    end: float


@attrs.frozen(kw_only=True)
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    # None where Whisper's figure is not a number (JSON has no NaN).
    avg_logprob: float | None
    compression_ratio: float | None
    no_speech_prob: float | None


@attrs.frozen(kw_only=True)
class Transcript:
    text: str
    # Whisper's language name in lower case ("english"), as OpenAI's verbose_json reports it.
    language: str
    duration: float
    segments: tuple[Segment, ...] = ()
    words: tuple[Word, ...] = ()
