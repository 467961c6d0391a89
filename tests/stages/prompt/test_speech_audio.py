"""Audio bytes to Whisper's samples in-process (stages/prompt/audio.py): formats, resampling, and refusals."""

from __future__ import annotations

import pytest

from pipeline.errors import RequestError
from stages.prompt.audio import SAMPLE_RATE, decode_audio
from tests.speech_clips import clip


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "OGG", "MP3"])
def test_each_format_decodes_to_16_khz_mono_of_the_clips_length(fmt: str) -> None:
    samples = decode_audio(clip(fmt, seconds=1.0, rate=44_100, channels=2), f"clip.{fmt.lower()}", max_seconds=60)
    assert samples.ndim == 1 and samples.dtype.name == "float32"
    # MP3 frames pad the end by a frame or two.
    assert abs(len(samples) - SAMPLE_RATE) < 0.1 * SAMPLE_RATE
    assert 0.01 < float(abs(samples).max()) <= 1.0


def _refusal(data: bytes, filename: str = "clip.wav", max_seconds: float = 60) -> RequestError:
    with pytest.raises(RequestError) as caught:
        decode_audio(data, filename, max_seconds=max_seconds)
    assert caught.value.param == "file"
    return caught.value


def test_empty_and_undecodable_files_are_refused_naming_file() -> None:
    assert "empty" in _refusal(b"").message
    assert "not audio" in _refusal(b"this is plain text, not a sound file" * 10).message


def test_a_container_it_cannot_open_is_named() -> None:
    mp4 = b"\x00\x00\x00\x20ftypisom" + bytes(64)
    assert "MP4" in _refusal(mp4, "clip.m4a").message
    assert "WebM" in _refusal(b"\x1a\x45\xdf\xa3" + bytes(64), "clip.webm").message


def test_a_file_past_the_duration_cap_is_refused_before_decoding() -> None:
    error = _refusal(clip(seconds=3.0), max_seconds=2.0)
    assert error.code == "audio_too_long" and "MLX_RELAY_AUDIO_MAX_SECONDS" in error.message
