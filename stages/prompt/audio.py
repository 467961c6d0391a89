"""Audio bytes to the 16 kHz mono float32 samples Whisper reads, in-process, with no system ffmpeg.

`soundfile`'s wheels bundle libsndfile, which reads WAV, FLAC, OGG (Vorbis,
Opus) and MP3 (OpenAI's formats but the MP4 family and WebM). mlx-whisper
would run the system's `ffmpeg` on a file; decoding here instead means
nothing outside the Python environment is needed, and a file that is not
audio, or is in a container libsndfile cannot open, is a 400 naming `file`
and its format before it reaches the model. The duration is read from the
header first, so a file longer than the cap is refused before it is decoded.
"""

from __future__ import annotations

import io
from math import gcd

import numpy as np

from pipeline.errors import RequestError, invalid
from stages.models.whisper import SAMPLE_RATE, Samples

# OpenAI's formats that libsndfile cannot open: refused naming the format.
_CONTAINERS = {"mp4": "MP4", "m4a": "M4A (MP4 audio)", "webm": "WebM", "mpeg": "MPEG", "mpga": "MPEG audio"}


def decode_audio(data: bytes, filename: str, *, max_seconds: float) -> Samples:
    """The file's audio as 16 kHz mono float32 samples.

    Raises:
        RequestError: 400 naming `file`: empty, not audio, a format this server cannot decode,
            longer than `max_seconds`, or silent of samples.
    """
    import soundfile

    if not data:
        raise invalid("'file' is empty", param="file")
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as sound:
            rate, frames = sound.samplerate, sound.frames
            if frames <= 0:
                raise invalid("'file' holds no audio samples", param="file")
            if frames / rate > max_seconds:
                seconds = f"{frames / rate:.1f}"
                raise invalid(
                    f"'file' is {seconds} s long, more than this server's limit of {max_seconds:g} s "
                    "(MLX_RELAY_AUDIO_MAX_SECONDS)",
                    param="file",
                    code="audio_too_long",
                )
            samples = sound.read(dtype="float32", always_2d=True)
    except soundfile.LibsndfileError:
        raise _undecodable(data, filename) from None
    except (RuntimeError, TypeError, ValueError):
        raise _undecodable(data, filename) from None
    mono = samples.mean(axis=1, dtype=np.float32)
    return _resampled(mono, rate)


def _resampled(samples: Samples, rate: int) -> Samples:
    if rate == SAMPLE_RATE:
        return np.ascontiguousarray(samples, dtype=np.float32)
    from scipy.signal import resample_poly

    common = gcd(rate, SAMPLE_RATE)
    resampled: Samples = resample_poly(samples, SAMPLE_RATE // common, rate // common).astype(np.float32)
    return resampled


def _undecodable(data: bytes, filename: str) -> RequestError:
    container = _container(data, filename)
    if container is not None:
        return invalid(
            f"'file' is {container} audio, which this server cannot decode; send WAV, FLAC, OGG or MP3",
            param="file",
            code="unsupported_audio_format",
        )
    return invalid(
        "'file' is not audio this server can decode (WAV, FLAC, OGG or MP3)", param="file", code="invalid_audio"
    )


def _container(data: bytes, filename: str) -> str | None:
    """The MP4-family or WebM container the bytes (or else the name) say, when it is one."""
    if data[4:8] == b"ftyp":
        return "MP4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "WebM"
    extension = filename.rpartition(".")[2].lower() if "." in filename else ""
    return _CONTAINERS.get(extension)
