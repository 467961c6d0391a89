"""A dedicated embedding model: what it is, how it pools, which sizes it may be cut to.

Served architectures: decoder embedding models that mlx-lm itself loads
(Qwen3-Embedding, gte-Qwen2 and others of an mlx-lm `model_type`), causal
attention, pooled over the last layer's hidden states and L2-normalized.
Encoders (BERT, XLM-R, ModernBERT: bidirectional attention, CLS or mean
pooling) are not: mlx-lm has no such architecture, and they are refused
at start-up by name.

`read_embedding_model` resolves the model like any other (a built-in
name, `shaped:<name>`, a local directory or a Hugging Face repo id) and
reads, once, beside its config:
- the pooling from sentence-transformers' files when present
  (`modules.json` names the Pooling module's folder, usually
  `1_Pooling/`, whose `config.json` sets `pooling_mode_lasttoken` or
  `pooling_mode_mean_tokens`); else the `fallback` setting;
- the Matryoshka sizes as vLLM reads them: the config's
  `matryoshka_dimensions` (only those sizes) or `is_matryoshka` (any
  size up to the width); a setting may declare them for a model whose
  config does not (vLLM's `--hf-overrides`).

Weights are loaded by `load_embedding_weights`, on the model thread only.
Such models are often published headless (the decoder's weights without
the `model.` prefix and no `lm_head`, as transformers saves an
`AutoModel`): both layouts load, a headless one with a tied head so that
nothing random is left in the model.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Literal

import attrs

from stages.models.loading import ModelInfo, resolve_model
from stages.models.mlx_internals import model_classes

Pooling = Literal["mean", "last"]
# model_type values of encoder architectures, which mlx-lm cannot load.
_ENCODERS = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "modernbert",
        "nomic_bert",
        "new",
        "distilbert",
        "mpnet",
        "electra",
        "deberta-v2",
    }
)
_POOLING_MODULE = "sentence_transformers.models.Pooling"


class EmbeddingModelError(ValueError):
    """A dedicated embedding model that cannot be served, said in one line."""


@attrs.frozen(kw_only=True)
class Matryoshka:
    """The sizes embeddings may be cut to: `sizes` only, or any size when `sizes` is empty."""

    sizes: tuple[int, ...] = ()


@attrs.frozen(kw_only=True)
class EmbeddingModel:
    info: ModelInfo
    pooling: Pooling
    hidden_size: int
    # None: the model declares no Matryoshka training, so `dimensions` is refused.
    matryoshka: Matryoshka | None
    # The weights hold no output head: a tied one is used (it scores nothing meaningful).
    headless: bool
    # Bytes of its weight files, for the memory plan.
    nbytes: int


def read_embedding_model(model: str, *, fallback: Pooling, matryoshka: str | None) -> EmbeddingModel:
    """Resolve and check a dedicated embedding model (off the model thread: no arrays).

    Args:
        model: as `MLX_RELAY_MODEL` takes it.
        fallback: the pooling when the model ships no sentence-transformers files.
        matryoshka: a declaration that overrides the config: "any", or sizes "256,512,1024".

    Raises:
        EmbeddingModelError: an encoder, an unknown architecture, a pooling that a
            causal model cannot give, or a bad Matryoshka declaration.
        FileNotFoundError: no such directory or repo.
    """
    info = resolve_model(model, name=None)
    config = json.loads((info.path / "config.json").read_text())
    text = config.get("text_config", config)
    kind = str(text.get("model_type", config.get("model_type", "")))
    if kind.lower() in _ENCODERS:
        raise EmbeddingModelError(
            f"embedding model {model!r} is an encoder ({kind}); only decoder embedding models "
            "that mlx-lm loads are served (Qwen3-Embedding, gte-Qwen2, ...)"
        )
    try:
        model_classes(config)
    except ValueError as error:
        raise EmbeddingModelError(
            f"embedding model {model!r}: mlx-lm cannot load model_type {kind!r} ({error})"
        ) from None
    size = text.get("hidden_size")
    if not isinstance(size, int):
        raise EmbeddingModelError(f"embedding model {model!r}: its config names no hidden_size")
    weights = sorted(info.path.glob("model*.safetensors"))
    return EmbeddingModel(
        info=info,
        pooling=_pooling(info.path, fallback, model),
        hidden_size=size,
        matryoshka=_matryoshka(matryoshka, config, size),
        headless=not any(_has_head(path) for path in weights),
        nbytes=sum(path.stat().st_size for path in weights),
    )


def load_embedding_weights(model: EmbeddingModel) -> Any:
    """The model, weights evaluated. Call only on the gateway's model thread."""
    from mlx_lm.utils import load_model

    overrides = {"tie_word_embeddings": True} if model.headless else None
    loaded, _ = load_model(model.info.path, model_config=overrides, get_model_classes=_prefixed_classes)
    return loaded


def allowed_dimensions(matryoshka: Matryoshka | None, dimensions: int, width: int) -> str | None:
    """Why `dimensions` cannot be given (a sentence), or None when it can."""
    if dimensions == width:
        return None
    if matryoshka is None:
        return f"this model does not support Matryoshka truncation: its embeddings have {width} dimensions"
    if matryoshka.sizes and dimensions not in matryoshka.sizes:
        return f"this model supports only these sizes: {', '.join(map(str, matryoshka.sizes))}"
    if dimensions > width:
        return f"this model's embeddings have {width} dimensions"
    return None


def _pooling(path: Path, fallback: Pooling, name: str) -> Pooling:
    modules = path / "modules.json"
    if not modules.is_file():
        return fallback
    folder = next(
        (m.get("path", "") for m in json.loads(modules.read_text()) if m.get("type") == _POOLING_MODULE), None
    )
    config_path = path / folder / "config.json" if folder is not None else None
    if config_path is None or not config_path.is_file():
        return fallback
    config = json.loads(config_path.read_text())
    if config.get("pooling_mode_lasttoken"):
        return "last"
    if config.get("pooling_mode_mean_tokens"):
        return "mean"
    modes = sorted(key for key, value in config.items() if key.startswith("pooling_mode") and value)
    raise EmbeddingModelError(
        f"embedding model {name!r} pools by {modes or 'nothing'}; a causal model is served with "
        "last-token or mean pooling only"
    )


def _matryoshka(declared: str | None, config: dict[str, Any], width: int) -> Matryoshka | None:
    if declared:
        if declared.strip().lower() == "any":
            return Matryoshka()
        try:
            sizes = tuple(sorted({int(part) for part in declared.split(",") if part.strip()}))
        except ValueError:
            raise EmbeddingModelError(
                f"MLX_RELAY_EMBEDDING_MATRYOSHKA must be 'any' or sizes '256,512', not {declared!r}"
            ) from None
        if not sizes or sizes[0] < 1 or sizes[-1] > width:
            raise EmbeddingModelError(f"MLX_RELAY_EMBEDDING_MATRYOSHKA sizes must lie in 1..{width}, got {declared!r}")
        return Matryoshka(sizes=sizes)
    listed = config.get("matryoshka_dimensions")
    if isinstance(listed, list) and listed:
        return Matryoshka(sizes=tuple(sorted(int(size) for size in listed)))
    return Matryoshka() if config.get("is_matryoshka") else None


def _has_head(path: Path) -> bool:
    # The safetensors header alone (8-byte length, then JSON): no tensor is read.
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        names = json.loads(file.read(length))
    return any(name.startswith("lm_head.") for name in names)


def _prefixed_classes(config: dict[str, Any]) -> tuple[type, type]:
    model_class, args_class = model_classes(config)

    class Prefixed(model_class):  # type: ignore[misc, valid-type]
        def sanitize(self, weights: dict[str, Any]) -> dict[str, Any]:
            # A headless checkpoint names the decoder's weights without the `model.` prefix mlx-lm's class expects.
            if not any(name.startswith(("model.", "lm_head.")) for name in weights):
                weights = {f"model.{name}": value for name, value in weights.items()}
            sanitized: dict[str, Any] = super().sanitize(weights) if hasattr(model_class, "sanitize") else weights
            return sanitized

    return Prefixed, args_class
