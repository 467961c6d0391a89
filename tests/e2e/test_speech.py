"""Speech to text through the official `openai` SDK on a real server: `tiny-whisper` alone, then beside `tiny`.

A random model's words and times are arbitrary, so the tests check shapes
and consistency (formats, timing in order and inside the clip, one text
across formats' fields), never the words.
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings

import httpx
import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.speech_clips import clip

pytestmark = pytest.mark.slow

SPEECH = "mlx-relay/tiny-whisper"
CLIP = ("clip.wav", clip("WAV", seconds=1.5), "audio/wav")
_SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d{3}) --> (\d\d):(\d\d):(\d\d),(\d{3})\n.*", re.S)
_VTT_CUE = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d{3}) --> (\d\d):(\d\d):(\d\d)\.(\d{3})\n.*", re.S)


@pytest.fixture(scope="module")
def speech(server_factory: ServerFactory) -> Server:
    return server_factory(model="tiny-whisper")


@pytest.fixture(scope="module")
def client(speech: Server) -> openai.OpenAI:
    return speech.client(timeout=120)


def _seconds(parts: tuple[str, ...]) -> float:
    hours, minutes, seconds, millis = map(int, parts)
    return hours * 3600 + minutes * 60 + seconds + millis / 1000


def _monotone(spans: list[tuple[float, float]], duration: float) -> None:
    clock = 0.0
    for start, end in spans:
        assert clock <= start <= end <= duration + 1e-6, spans
        clock = end


# Three 30-second windows with word timing: seconds of work on any machine, where a 1.5-second clip
# finished within the second that a fixed sleep allowed it on a fast one.
_LONG_CLIP = ("long.wav", clip("WAV", seconds=90), "audio/wav")


def _occupy_the_speech_thread(client: openai.OpenAI, server: Server) -> threading.Thread:
    """A long transcription, started and seen admitted (in flight) before this returns."""
    long_one = threading.Thread(
        target=lambda: client.audio.transcriptions.create(
            file=_LONG_CLIP,
            model=SPEECH,
            response_format="verbose_json",
            timestamp_granularities=["word"],
            temperature=0.2,
        )
    )
    long_one.start()
    deadline = time.monotonic() + 30
    while loopback.get(f"{server.base_url}/stats", timeout=10).json()["admission"]["in_flight"] < 1:
        assert time.monotonic() < deadline and long_one.is_alive(), "the long transcription was never admitted"
        time.sleep(0.02)
    return long_one


def test_json_is_the_transcript_text(client: openai.OpenAI) -> None:
    transcription = client.audio.transcriptions.create(file=CLIP, model="whisper-1", language="en")
    assert isinstance(transcription.text, str)
    assert transcription.usage is not None and transcription.usage.type == "duration"


def test_verbose_json_segments_are_timed_in_order_inside_the_clip(client: openai.OpenAI) -> None:
    verbose = client.audio.transcriptions.create(
        file=CLIP, model=SPEECH, response_format="verbose_json", language="en", temperature=0.2
    )
    assert verbose.language == "english" and verbose.duration == pytest.approx(1.5)
    assert verbose.segments is not None and verbose.words is None
    _monotone([(segment.start, segment.end) for segment in verbose.segments], verbose.duration)
    assert [segment.id for segment in verbose.segments] == list(range(len(verbose.segments)))
    assert "".join(segment.text for segment in verbose.segments).strip() == verbose.text


def test_word_timestamps_lie_inside_their_segments(client: openai.OpenAI) -> None:
    verbose = client.audio.transcriptions.create(
        file=CLIP,
        model=SPEECH,
        response_format="verbose_json",
        language="en",
        temperature=0.2,
        timestamp_granularities=["word", "segment"],
    )
    assert verbose.words is not None and verbose.segments is not None
    _monotone([(word.start, word.end) for word in verbose.words], verbose.duration)


@pytest.mark.parametrize("response_format", ["srt", "vtt"])
def test_subtitles_are_well_formed(client: openai.OpenAI, response_format: str) -> None:
    body = client.audio.transcriptions.create(
        file=CLIP, model=SPEECH, response_format=response_format, language="en", temperature=0.2
    )  # type: ignore[call-overload]
    assert isinstance(body, str)
    if response_format == "vtt":
        assert body.startswith("WEBVTT\n\n") or body == "WEBVTT\n"
        cues, pattern, numbered = body.removeprefix("WEBVTT\n").strip("\n"), _VTT_CUE, False
    else:
        cues, pattern, numbered = body.strip("\n"), _SRT_CUE, True
    spans = []
    for number, cue in enumerate(filter(None, cues.split("\n\n")), start=1):
        match = pattern.fullmatch(cue)
        assert match is not None, cue
        groups = match.groups()[1:] if numbered else match.groups()
        assert not numbered or int(match.group(1)) == number
        spans.append((_seconds(groups[:4]), _seconds(groups[4:])))
    _monotone(spans, 1.5)


def test_text_is_plain(client: openai.OpenAI) -> None:
    text = client.audio.transcriptions.create(file=CLIP, model=SPEECH, response_format="text", temperature=0.2)
    assert isinstance(text, str) and not text.startswith("{")


def test_translations_answer_english_in_each_shape(client: openai.OpenAI) -> None:
    with warnings.catch_warnings():
        # The SDK marks the endpoint deprecated (OpenAI still serves it with whisper-1); its clients still call it.
        warnings.simplefilter("ignore", DeprecationWarning)
        translation = client.audio.translations.create(file=CLIP, model=SPEECH, temperature=0.2)
        verbose = client.audio.translations.create(
            file=CLIP, model=SPEECH, response_format="verbose_json", temperature=0.2
        )
    assert isinstance(translation.text, str)
    assert verbose.language == "english" and verbose.duration == pytest.approx(1.5)
    assert json.loads(verbose.model_dump_json())["segments"] is not None


@pytest.mark.parametrize("fmt", ["FLAC", "OGG", "MP3"])
def test_other_formats_are_decoded_in_process(client: openai.OpenAI, fmt: str) -> None:
    data = clip(fmt, seconds=1.0, rate=22_050, channels=2)
    verbose = client.audio.transcriptions.create(
        file=(f"clip.{fmt.lower()}", data), model=SPEECH, response_format="verbose_json", language="en", temperature=0.2
    )
    assert verbose.duration == pytest.approx(1.0, abs=0.1)


def _refused(client: openai.OpenAI, param: str, **kwargs: object) -> openai.BadRequestError:
    arguments: dict[str, object] = {"file": CLIP, "model": SPEECH, **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(**arguments)  # type: ignore[call-overload]
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == param and body["type"] == "invalid_request_error", body
    return caught.value


def test_bad_inputs_are_400_naming_the_field(client: openai.OpenAI) -> None:
    _refused(client, "file", file=("clip.wav", b""))
    _refused(client, "file", file=("notes.wav", b"not audio at all" * 20))
    assert "MP4" in _refused(client, "file", file=("clip.m4a", b"\x00\x00\x00\x20ftypM4A " + bytes(64))).message
    _refused(client, "response_format", response_format="xml")
    _refused(client, "language", language="xx")
    _refused(client, "temperature", temperature=3)
    _refused(client, "timestamp_granularities", timestamp_granularities=["word"])
    _refused(client, "include", include=["logprobs"])


def test_streaming_is_refused_by_name(speech: Server) -> None:
    response = loopback.post(
        f"{speech.v1}/audio/transcriptions", files={"file": CLIP}, data={"model": SPEECH, "stream": "true"}, timeout=60
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream"


def test_no_file_and_json_bodies_are_refused(speech: Server) -> None:
    response = loopback.post(f"{speech.v1}/audio/transcriptions", files={"model": (None, SPEECH)}, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "file"
    response = loopback.post(f"{speech.v1}/audio/transcriptions", json={"model": SPEECH}, timeout=60)
    assert response.status_code == 415


def test_caps_are_settings(server_factory: ServerFactory) -> None:
    """In process, the one server here that is: the speech model on a thread of the HTTP process (`--in-process`)
    decodes, refuses and transcribes as it does in its worker."""
    capped = server_factory(model="tiny-whisper", audio_max_seconds="1", audio_max_bytes="60000", in_process="1")
    client = capped.client(timeout=60)
    verbose = client.audio.transcriptions.create(
        file=("short.wav", clip("WAV", seconds=0.5)), model=SPEECH, response_format="verbose_json", temperature=0.2
    )
    assert verbose.duration == pytest.approx(0.5)
    stats = loopback.get(f"{capped.base_url}/stats", timeout=10).json()
    assert stats["worker"] is None and stats["running"], stats
    error = _refused(client, "file", file=("long.wav", clip("WAV", seconds=1.5)))
    assert error.code == "audio_too_long"
    error = _refused(client, "file", file=("big.wav", clip("WAV", seconds=0.5) + bytes(60_000)))
    assert error.code == "audio_too_large"


def test_the_speech_model_alone_is_listed_and_refuses_chat(client: openai.OpenAI, speech: Server) -> None:
    cards = [model.model_dump() for model in client.models.list()]
    assert cards[0]["id"] == SPEECH and cards[0]["type"] == "speech-to-text"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=SPEECH, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_not_supported"
    assert loopback.get(f"{speech.base_url}/health", timeout=10).json()["status"] == "ok"
    # By default the model runs in a worker process of its own, as a chat model does.
    worker = loopback.get(f"{speech.base_url}/stats", timeout=10).json()["worker"]
    assert worker["state"] == "ready" and worker["pid"] not in (None, speech.process.pid), worker


@pytest.fixture(scope="module")
def both(server_factory: ServerFactory) -> Server:
    return server_factory(model="tiny,tiny-whisper")


def test_both_models_serve_side_by_side(both: Server) -> None:
    client = both.client(timeout=120)
    names = {model.id for model in client.models.list()}
    assert {"mlx-relay/tiny", "tiny", SPEECH, "tiny-whisper"} <= names
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.content is not None
    transcription = client.audio.transcriptions.create(file=CLIP, model="tiny-whisper", temperature=0.2)
    assert isinstance(transcription.text, str)
    with pytest.raises(openai.BadRequestError) as caught:
        client.audio.transcriptions.create(file=CLIP, model="tiny")
    assert caught.value.code == "model_not_supported"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny-whisper", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(file=CLIP, model="whisper-9")


def test_a_transcription_whose_client_left_while_queued_is_dropped_unrun(client: openai.OpenAI, speech: Server) -> None:
    long_one = _occupy_the_speech_thread(client, speech)  # the next one queues behind it
    with pytest.raises(httpx.ReadTimeout):
        loopback.post(
            f"{speech.v1}/audio/transcriptions",
            files={"file": CLIP},
            data={"model": SPEECH},
            headers={"x-request-id": "left-while-queued"},
            timeout=httpx.Timeout(60, read=1.0),
        )
    long_one.join()
    deadline = time.monotonic() + 30
    while '"outcome": "cancelled"' not in speech.logs() and time.monotonic() < deadline:
        time.sleep(0.2)
    events = [json.loads(line) for line in speech.logs().splitlines() if "left-while-queued" in line]
    ran = [event for event in events if event.get("event") == "request.transcribe"]
    assert ran and ran[0]["outcome"] == "cancelled", events


def test_past_the_queue_bound_a_transcription_is_429(server_factory: ServerFactory) -> None:
    bounded = server_factory(model="tiny-whisper", exclusive_pending="1", admission_timeout="0.5")
    client = bounded.client(timeout=120)
    client.audio.transcriptions.create(file=CLIP, model=SPEECH, temperature=0.2)  # the model is loaded
    long_one = _occupy_the_speech_thread(client, bounded)
    try:
        with pytest.raises(openai.RateLimitError):
            client.audio.transcriptions.create(file=CLIP, model=SPEECH, temperature=0.2)
    finally:
        long_one.join()
