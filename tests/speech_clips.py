"""Speech-like audio made at test time (nothing large is committed): a voiced, syllable-paced tone.

A glottal-pulse-like harmonic series on a wandering pitch of 110–170 Hz,
amplitude-modulated at four syllables a second, with a pause between two
phrases: the spectrum and rhythm of speech, without words.
"""

from __future__ import annotations

import io

import numpy as np
import soundfile


def speechlike(seconds: float = 1.5, rate: int = 16_000, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    syllables = 0.5 * (1 + np.sin(2 * np.pi * 4 * t))
    pause = np.where((t > seconds * 0.45) & (t < seconds * 0.55), 0.05, 1.0)
    mono = (0.2 * voice * syllables * pause).astype(np.float32)
    return np.stack([mono] * channels, axis=1) if channels > 1 else mono


def clip(fmt: str = "WAV", *, seconds: float = 1.5, rate: int = 16_000, channels: int = 1) -> bytes:
    """The clip encoded as `fmt` (any format libsndfile writes: WAV, FLAC, OGG, MP3)."""
    buffer = io.BytesIO()
    subtype = {"WAV": "PCM_16", "FLAC": "PCM_16", "OGG": "VORBIS", "MP3": "MPEG_LAYER_III"}[fmt]
    soundfile.write(buffer, speechlike(seconds, rate, channels), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()
