"""Whisper models through mlx-whisper: the built-in `tiny-whisper`, loading, and one transcription.

The only module that imports `mlx_whisper` (the `audio` extra), so its
names and its process-wide model holder are touched in one place.

`tiny-whisper` is a random-weight model of Whisper's real architecture and
interface: whisper-tiny's 80 mel bins, 1500 audio positions and 51,865-token
multilingual vocabulary (mlx-whisper's own `multilingual.tiktoken`, shipped
in its package), with narrow, shallow layers and a 64-token text window, so a
30-second window decodes at most 32 tokens and a test stays short. Written as
mlx-whisper's model directory (`config.json`, `weights.safetensors`), built
once into the cache the demo models use. Like them it babbles: its words and
timestamps are arbitrary.
"""

from __future__ import annotations

import importlib
import json
import threading
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from stages.models.publish import build_once, default_cache_root

TINY_WHISPER = "tiny-whisper"
# Whisper reads 16 kHz mono float32 samples.
SAMPLE_RATE = 16_000
Samples = np.ndarray[Any, np.dtype[np.float32]]
# Bump when the build changes, so no cache keeps serving an old build.
_BUILDER_VERSION = 1
# whisper-tiny's interface (mels, audio positions, vocabulary); narrower and shallower inside.
_TINY_DIMS = {
    "n_mels": 80,
    "n_audio_ctx": 1500,
    "n_audio_state": 64,
    "n_audio_head": 2,
    "n_audio_layer": 2,
    "n_vocab": 51865,
    "n_text_ctx": 64,
    "n_text_state": 64,
    "n_text_head": 2,
    "n_text_layer": 2,
}
# mlx-whisper keeps one model process-wide (`ModelHolder`); transcriptions take turns at it.
_HOLDER = threading.Lock()


@attrs.frozen(kw_only=True)
class SpeechInfo:
    path: Path
    name: str
    # Tokens of the decoder's window (Whisper's `n_text_ctx`).
    context_window: int
    vocab_size: int
    multilingual: bool


def ensure_tiny_whisper() -> Path:
    """The built-in `tiny-whisper` directory, built first if not cached."""
    return build_once(default_cache_root() / f"{TINY_WHISPER}-{_BUILDER_VERSION}", _build_tiny)


def _build_tiny(staging: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_whisper.whisper import ModelDimensions, Whisper

    mx.random.seed(0)
    model = Whisper(ModelDimensions(**_TINY_DIMS), mx.float32)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(staging / "weights.safetensors"), weights)
    (staging / "config.json").write_text(json.dumps({"model_type": "whisper", **_TINY_DIMS}, indent=2))


def is_speech_model(path: Path) -> bool:
    """Whether the directory holds a Whisper model (mlx-whisper's config), not a language model."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "n_audio_ctx" in config and "n_text_ctx" in config


def read_speech_info(path: Path, name: str) -> SpeechInfo:
    config = json.loads((path / "config.json").read_text())
    vocab = int(config["n_vocab"])
    return SpeechInfo(
        path=path, name=name, context_window=int(config["n_text_ctx"]), vocab_size=vocab, multilingual=vocab >= 51865
    )


def load_speech_model(info: SpeechInfo) -> Any:
    """The model, weights evaluated; call only on the speech model's thread."""
    import mlx.core as mx
    from mlx_whisper.load_models import load_model

    return load_model(str(info.path), dtype=_dtype(mx))


def _dtype(mx: Any) -> Any:
    # MLX's CPU float16 matmuls do not use the BLAS: float32 there, float16 on a GPU (mlx-whisper's default).
    return mx.float16 if mx.default_device() == mx.gpu else mx.float32


def transcribe(model: Any, info: SpeechInfo, audio: Any, options: dict[str, Any]) -> dict[str, Any]:
    """mlx-whisper's `transcribe` of a 16 kHz mono float32 array with `model`; on the speech model's thread."""
    import mlx.core as mx
    from mlx_whisper.transcribe import ModelHolder
    from mlx_whisper.transcribe import transcribe as whisper_transcribe

    with _HOLDER:
        ModelHolder.model, ModelHolder.model_path = model, str(info.path)
        fp16 = _dtype(mx) == mx.float16
        result: dict[str, Any] = whisper_transcribe(audio, path_or_hf_repo=str(info.path), fp16=fp16, **options)
        return result


def language_codes() -> dict[str, str]:
    """Whisper's languages: each ISO-639-1 code and its English name."""
    from mlx_whisper.tokenizer import LANGUAGES

    return dict(LANGUAGES)


def names_speech_model(source: str | None, *, demo: str) -> bool:
    """Whether `speech_info_for` finds a speech model in `source`; reads at most a config, builds nothing."""
    chosen = source or demo
    return chosen == TINY_WHISPER or is_speech_model(Path(chosen).expanduser())


def import_speech() -> None:
    """Imports what a speech worker loads and transcribes with (mlx-whisper, scipy and numba through it, and the
    audio decoder's libsndfile binding), so a worker forked after it starts with them done (stages/remote/zygote.py).

    Raises:
        ImportError: the `audio` extra is not installed.
    """
    for module in ("mlx_whisper.load_models", "mlx_whisper.tokenizer", "mlx_whisper.transcribe", "soundfile"):
        importlib.import_module(module)


def speech_info_for(source: str | None, *, demo: str, name: str | None) -> SpeechInfo | None:
    """The speech model `source` names (the built-in or a directory in mlx-whisper's format); None for any
    other model. Blocking: it may build `tiny-whisper` first."""
    chosen = source or demo
    if chosen == TINY_WHISPER:
        return read_speech_info(ensure_tiny_whisper(), name or f"mlx-relay/{TINY_WHISPER}")
    path = Path(chosen).expanduser()
    return read_speech_info(path, name or chosen) if is_speech_model(path) else None
