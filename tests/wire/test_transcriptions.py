"""OpenAI's audio form decoded and its replies rendered (wire/transcriptions.py, wire/subtitles.py)."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.errors import RequestError
from pipeline.transcripts import ResponseFormat, Segment, Task, Transcript, TranscriptionRequest, Word
from wire.subtitles import srt, timestamp, vtt
from wire.transcriptions import decode_transcription, render

FILE = (b"RIFF....", "clip.wav")


def _segment(index: int, start: float, end: float, text: str) -> Segment:
    return Segment(
        id=index,
        seek=0,
        start=start,
        end=end,
        text=text,
        tokens=(1, 2),
        temperature=0.0,
        avg_logprob=-0.5,
        compression_ratio=1.2,
        no_speech_prob=None,
    )


SEGMENTS = (_segment(0, 0.0, 1.5, " Hello there."), _segment(1, 1.5, 3725.0106, " A --> B\n\nC"))


@pytest.mark.parametrize(
    ("seconds", "comma", "dot"),
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (1.5, "00:00:01,500", "00:00:01.500"),
        (61.0004, "00:01:01,000", "00:01:01.000"),
        (3725.0106, "01:02:05,011", "01:02:05.011"),
        (59.9996, "00:01:00,000", "00:01:00.000"),
        (-0.2, "00:00:00,000", "00:00:00.000"),
    ],
)
def test_timestamps_are_hours_minutes_seconds_and_milliseconds(seconds: float, comma: str, dot: str) -> None:
    assert timestamp(seconds, separator=",") == comma
    assert timestamp(seconds, separator=".") == dot


def test_srt_numbers_cues_from_one_with_comma_times() -> None:
    first = "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n"
    second = "2\n00:00:01,500 --> 01:02:05,011\nA -> B C\n"
    assert srt(SEGMENTS) == first + "\n" + second


def test_vtt_opens_with_its_header_and_uses_dot_times() -> None:
    body = vtt(SEGMENTS)
    assert body.startswith("WEBVTT\n\n")
    cues = body.removeprefix("WEBVTT\n\n").split("\n\n")
    assert cues[0] == "00:00:00.000 --> 00:00:01.500\nHello there."
    assert cues[1] == "00:00:01.500 --> 01:02:05.011\nA -> B C\n"
    assert vtt(()) == "WEBVTT\n"


def _form(**fields: str | list[str]) -> dict[str, list[str]]:
    return {name: value if isinstance(value, list) else [value] for name, value in fields.items()}


def test_a_full_form_decodes() -> None:
    form = _form(
        model="whisper-1",
        language="en",
        prompt="Names: Ada.",
        temperature="0.3",
        response_format="verbose_json",
        **{"timestamp_granularities[]": ["word", "segment"]},
    )
    decoded = decode_transcription(form, FILE, task=Task.TRANSCRIBE)
    assert (decoded.language, decoded.prompt, decoded.temperature) == ("en", "Names: Ada.", 0.3)
    assert decoded.response_format is ResponseFormat.VERBOSE_JSON and decoded.words and decoded.segments
    assert decoded.audio == FILE[0] and decoded.filename == "clip.wav"


@pytest.mark.parametrize(
    ("form", "file", "task", "param"),
    [
        (_form(model="m"), None, Task.TRANSCRIBE, "file"),
        (_form(), FILE, Task.TRANSCRIBE, "model"),
        (_form(model="m", response_format="xml"), FILE, Task.TRANSCRIBE, "response_format"),
        (_form(model="m", temperature="hot"), FILE, Task.TRANSCRIBE, "temperature"),
        (_form(model="m", temperature="1.5"), FILE, Task.TRANSCRIBE, "temperature"),
        (_form(model="m", **{"timestamp_granularities[]": "word"}), FILE, Task.TRANSCRIBE, "timestamp_granularities"),
        (
            _form(model="m", response_format="verbose_json", **{"timestamp_granularities[]": "char"}),
            FILE,
            Task.TRANSCRIBE,
            "timestamp_granularities",
        ),
        (_form(model="m", stream="true"), FILE, Task.TRANSCRIBE, "stream"),
        (_form(model="m", **{"include[]": "logprobs"}), FILE, Task.TRANSCRIBE, "include"),
        (_form(model="m", chunking_strategy="auto"), FILE, Task.TRANSCRIBE, "chunking_strategy"),
        (_form(model="m", language="fr"), FILE, Task.TRANSLATE, "language"),
        (_form(model="m", colour="blue"), FILE, Task.TRANSCRIBE, "colour"),
        (_form(model=["a", "b"]), FILE, Task.TRANSCRIBE, "model"),
    ],
)
def test_bad_forms_are_refused_naming_the_field(
    form: dict[str, list[str]], file: tuple[bytes, str] | None, task: Task, param: str
) -> None:
    with pytest.raises(RequestError) as caught:
        decode_transcription(form, file, task=task)
    assert caught.value.param == param and caught.value.status == 400


TRANSCRIPT = Transcript(
    text="Hello there. A B C",
    language="english",
    duration=3.2,
    segments=SEGMENTS,
    words=(Word(word="Hello", start=0.0, end=0.4),),
)


def _request(
    response_format: ResponseFormat, *, words: bool = False, segments: bool = False, task: Task = Task.TRANSCRIBE
) -> TranscriptionRequest:
    return TranscriptionRequest(
        audio=b"", filename="", model="m", task=task, response_format=response_format, words=words, segments=segments
    )


def test_json_and_text_carry_the_text() -> None:
    body, media = render(TRANSCRIPT, _request(ResponseFormat.JSON))
    assert body == {"text": "Hello there. A B C", "usage": {"type": "duration", "seconds": 4}}
    assert media == "application/json"
    assert render(TRANSCRIPT, _request(ResponseFormat.TEXT)) == ("Hello there. A B C\n", "text/plain; charset=utf-8")
    assert render(TRANSCRIPT, _request(ResponseFormat.VTT))[1].startswith("text/vtt")


def test_verbose_json_carries_what_was_asked() -> None:
    body, _ = render(TRANSCRIPT, _request(ResponseFormat.VERBOSE_JSON, segments=True))
    assert isinstance(body, dict)
    assert (body["task"], body["language"], body["duration"]) == ("transcribe", "english", 3.2)
    assert "words" not in body and len(body["segments"]) == 2  # type: ignore[arg-type]
    json.dumps(body, allow_nan=False)
    words, _ = render(TRANSCRIPT, _request(ResponseFormat.VERBOSE_JSON, words=True, task=Task.TRANSLATE))
    assert isinstance(words, dict) and words["task"] == "translate" and "segments" not in words
    assert words["words"] == [{"word": "Hello", "start": 0.0, "end": 0.4}]


def test_srt_cues_are_well_formed() -> None:
    cue = re.compile(r"\d+\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n[^\n]*\n")
    assert all(cue.fullmatch(part + "\n") for part in srt(SEGMENTS).rstrip("\n").split("\n\n"))
