"""One transcription as exclusive work on the speech model's thread, and mlx-whisper's result as a `Transcript`.

A transcription is one unit: mlx-whisper's loop over 30-second windows has
no seam to stop at, so a job cancelled while queued is dropped unrun, and
one already running ends with its audio (bounded by the duration cap) and
its result is dropped.

A random-weight model (and a real one hallucinating past the end) can give
timestamps out of order or past the audio's end; the transcript's times are
clamped to the audio and made monotone, so every segment and word lies in
[0, duration] and starts where the one before it ended or later.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from pipeline.transcripts import Segment, Transcript, TranscriptionRequest, Word
from stages.models.whisper import SAMPLE_RATE, Samples, SpeechInfo, transcribe

# Whisper's temperatures when the client leaves it at 0 or unset: a window that decodes badly
# (compression or log-probability thresholds) is decoded again warmer, as OpenAI does for 0.
_FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@attrs.define(eq=False)
class TranscribeWork:
    request: TranscriptionRequest
    samples: Samples
    info: SpeechInfo
    _result: Transcript | None = attrs.field(default=None, init=False)

    def remaining(self) -> int:
        return 0 if self._result is not None else 1

    def run_chunk(self, model: Any, max_units: int) -> int:
        raw = transcribe(model, self.info, self.samples, whisper_options(self.request))
        self._result = transcript_of(raw, duration=len(self.samples) / SAMPLE_RATE, words=self.request.words)
        return 1

    def result(self) -> Transcript:
        assert self._result is not None, "the model thread ran it"
        return self._result


def whisper_options(request: TranscriptionRequest) -> dict[str, Any]:
    temperature = request.temperature
    return {
        "task": request.task.value,
        "language": request.language,
        "initial_prompt": request.prompt or None,
        "temperature": _FALLBACK if not temperature else (temperature,),
        "word_timestamps": request.words,
    }


def transcript_of(raw: dict[str, Any], *, duration: float, words: bool) -> Transcript:
    """mlx-whisper's result, its times clamped to the audio and monotone."""
    from stages.models.whisper import language_codes

    segments: list[Segment] = []
    spoken: list[Word] = []
    clock = 0.0
    for item in raw.get("segments", ()):
        if not str(item.get("text", "")).strip():
            continue  # Whisper clears a window's instantaneous or textless segments; none is returned
        start = _clamp(item["start"], clock, duration)
        end = _clamp(item["end"], start, duration)
        segments.append(_segment(len(segments), item, start, end))
        clock = end
        if words:
            word_clock = start
            for word in item.get("words", ()):
                word_start = _clamp(word["start"], word_clock, end)
                word_end = _clamp(word["end"], word_start, end)
                spoken.append(Word(word=str(word["word"]).strip(), start=word_start, end=word_end))
                word_clock = word_end
    code = str(raw.get("language") or "en")
    return Transcript(
        text=str(raw.get("text", "")).strip(),
        language=language_codes().get(code, code),
        duration=round(duration, 3),
        segments=tuple(segments),
        words=tuple(spoken),
    )


def _segment(index: int, item: dict[str, Any], start: float, end: float) -> Segment:
    return Segment(
        id=index,
        seek=int(item.get("seek", 0)),
        start=start,
        end=end,
        text=str(item.get("text", "")),
        tokens=tuple(int(token) for token in item.get("tokens", ())),
        temperature=float(item.get("temperature", 0.0)),
        avg_logprob=_finite(item.get("avg_logprob")),
        compression_ratio=_finite(item.get("compression_ratio")),
        no_speech_prob=_finite(item.get("no_speech_prob")),
    )


def _finite(value: Any) -> float | None:
    """A figure JSON can carry: None where Whisper's is not a number (a window a random model scored at -inf)."""
    number = float(value) if value is not None else math.nan
    return number if math.isfinite(number) else None


def _clamp(value: Any, low: float, high: float) -> float:
    return round(min(max(float(value), low), high), 3)
