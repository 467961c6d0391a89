"""mlx-whisper's result as a transcript (stages/model_thread/transcribe.py): times inside the audio and in order."""

from __future__ import annotations

import json
import math

import attrs

from pipeline.transcripts import TranscriptionRequest
from stages.model_thread.transcribe import transcript_of, whisper_options


def _raw(segments: list[dict[str, object]]) -> dict[str, object]:
    return {"text": " !!  ", "language": "fr", "segments": segments}


def _item(
    start: float, end: float, text: str = " a", words: list[dict[str, object]] | None = None
) -> dict[str, object]:
    return {
        "seek": 0,
        "start": start,
        "end": end,
        "text": text,
        "tokens": [1],
        "temperature": 0.0,
        "avg_logprob": -math.inf,
        "compression_ratio": math.nan,
        "no_speech_prob": 0.1,
        "words": words or [],
    }


def test_segments_and_words_are_clamped_to_the_audio_and_monotone() -> None:
    words = [{"word": " x", "start": 0.9, "end": 0.2}, {"word": " y", "start": 0.1, "end": 9.0}]
    raw = _raw([_item(0.5, 11.9, words=words), _item(11.9, 6.9), _item(0.0, 0.0, "  "), _item(6.9, 26.3)])
    transcript = transcript_of(raw, duration=3.0, words=True)
    times = [(segment.start, segment.end) for segment in transcript.segments]
    assert times == [(0.5, 3.0), (3.0, 3.0), (3.0, 3.0)]
    assert [segment.id for segment in transcript.segments] == [0, 1, 2]
    assert [(word.word, word.start, word.end) for word in transcript.words] == [("x", 0.9, 0.9), ("y", 0.9, 3.0)]
    assert transcript.language == "french" and transcript.text == "!!" and transcript.duration == 3.0


def test_figures_that_are_not_numbers_become_null() -> None:
    segment = transcript_of(_raw([_item(0.0, 1.0)]), duration=1.0, words=False).segments[0]
    assert segment.avg_logprob is None and segment.compression_ratio is None and segment.no_speech_prob == 0.1
    json.dumps(attrs.asdict(segment), allow_nan=False)


def test_temperature_zero_or_unset_falls_back_warmer_as_openai_does() -> None:
    request = TranscriptionRequest(audio=b"", filename="", model="m")
    assert whisper_options(request)["temperature"] == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert whisper_options(attrs.evolve(request, temperature=0.0))["temperature"][0] == 0.0
    assert whisper_options(attrs.evolve(request, temperature=0.3))["temperature"] == (0.3,)
