"""A model's footprint from its config.json: the KV a row holds, in mlx-lm's cache blocks.

mlx-lm's KVCache (and the batch's BatchKVCache) grows in blocks of 256
tokens; a sliding-window layer (RotatingKVCache) grows the same way but
never past its window. So a row of n tokens holds
`full_layers x block(n) + sliding_layers x min(window, block(n))` tokens'
worth of one layer's keys and values.

With a quantized KV cache (`KvScheme`), each head's row of keys or values
is `head_dim x bits / 8` bytes of packed values plus a scale and a bias
per group of `group_size`, in the model's dtype, as `mx.quantize` lays
them out (mlx-lm's QuantizedKVCache).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

# mlx-lm's KVCache.step, RotatingKVCache.step and BatchKVCache.step.
BLOCK = 256
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Activations and KV are float16/bfloat16 in most served models.
_DEFAULT_DTYPE_BYTES = 2


def blocks(tokens: int) -> int:
    """`tokens` rounded up to whole cache blocks."""
    return -(-tokens // BLOCK) * BLOCK


@attrs.frozen(kw_only=True)
class KvScheme:
    """How the KV cache stores keys and values: full precision (`bits` None), or `bits`-bit groups."""

    bits: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.in_((4, 8))))
    group_size: int = attrs.field(default=64, validator=attrs.validators.in_((32, 64, 128)))

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    def describe(self) -> str:
        """One word for /fit, /stats and the disk tier's files: "full" or "q8g64"."""
        return "full" if self.bits is None else f"q{self.bits}g{self.group_size}"

    def head_row_bytes(self, head_dim: int, dtype_bytes: int) -> int:
        """One token's keys (or values) for one head."""
        if self.bits is None:
            return head_dim * dtype_bytes
        return head_dim * self.bits // 8 + 2 * (head_dim // self.group_size) * dtype_bytes


FULL = KvScheme()


@attrs.frozen(kw_only=True)
class ModelShape:
    weights_bytes: int
    layers: int
    kv_heads: int
    head_dim: int
    attention_heads: int
    hidden_size: int
    intermediate_size: int
    dtype_bytes: int
    context_window: int
    # Layers whose cache keeps only the last `sliding_window` tokens.
    sliding_layers: int = 0
    sliding_window: int | None = None
    kv_scheme: KvScheme = FULL

    @property
    def layer_token_bytes(self) -> int:
        """One token's keys and values in one layer, as the KV scheme stores them."""
        return self.kv_heads * 2 * self.kv_scheme.head_row_bytes(self.head_dim, self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """What each further token costs once the sliding windows are full: the full-attention layers."""
        return (self.layers - self.sliding_layers) * self.layer_token_bytes

    def kv_bytes(self, tokens: int) -> int:
        """The KV one row of `tokens` tokens holds, in whole cache blocks."""
        held = blocks(tokens)
        sliding = min(held, self.sliding_window) if self.sliding_window else held
        return self.kv_bytes_per_token * held + self.sliding_layers * self.layer_token_bytes * sliding


def read_model_shape(path: Path, context_window: int) -> ModelShape:
    """The figures of the model directory's config.json and weight files."""
    config: dict[str, Any] = json.loads((path / "config.json").read_text())
    weights = sum(file.stat().st_size for file in path.glob("*.safetensors"))
    return shape_from_config(config, weights_bytes=weights, context_window=context_window)


def shape_from_config(config: dict[str, Any], *, weights_bytes: int, context_window: int) -> ModelShape:
    """The figures of a Hugging Face config.json (a multimodal one's `text_config`)."""
    text = config.get("text_config") or config
    heads = int(text.get("num_attention_heads") or text.get("n_head") or 1)
    hidden = int(text.get("hidden_size") or text.get("n_embd") or 0)
    layers = _attention_layers(text, int(text.get("num_hidden_layers") or text.get("n_layer") or 0))
    dtype = str(text.get("torch_dtype") or config.get("torch_dtype") or "")
    # A mixture of experts runs its chosen experts' MLPs for each token.
    experts = int(text.get("moe_intermediate_size") or 0) * int(text.get("num_experts_per_tok") or 0)
    sliding_layers, window = _sliding(text, layers)
    return ModelShape(
        weights_bytes=weights_bytes,
        layers=layers,
        kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        attention_heads=heads,
        hidden_size=hidden,
        intermediate_size=max(int(text.get("intermediate_size") or 4 * hidden), experts),
        dtype_bytes=_DTYPE_BYTES.get(dtype, _DEFAULT_DTYPE_BYTES),
        context_window=context_window,
        sliding_layers=sliding_layers,
        sliding_window=window,
    )


def _attention_layers(text: dict[str, Any], layers: int) -> int:
    """The layers that keep keys and values per token.

    A hybrid model's recurrent layers (Qwen3-Next, Qwen3.5: every
    `full_attention_interval`-th layer attends, the others are linear
    attention) hold a state of fixed size, not a growing KV cache.
    """
    interval = text.get("full_attention_interval")
    if interval:
        return layers // int(interval)
    types = text.get("layer_types")
    if isinstance(types, list) and any(kind == "linear_attention" for kind in types):
        return sum(1 for kind in types[:layers] if kind != "linear_attention")
    return layers


def _sliding(text: dict[str, Any], layers: int) -> tuple[int, int | None]:
    """How many layers attend through a sliding window, and its width.

    As mlx-lm builds the caches: `layer_types` names each layer (gpt-oss,
    newer configs); Gemma 3 makes every `sliding_window_pattern`-th layer
    global. A `sliding_window` with neither (Mistral, Qwen) is not one
    mlx-lm honours, so those layers count in full.
    """
    window = text.get("sliding_window")
    if not window or text.get("use_sliding_window") is False:
        return 0, None
    types = text.get("layer_types")
    if isinstance(types, list):
        count = sum(1 for kind in types[:layers] if kind == "sliding_attention")
    elif text.get("sliding_window_pattern"):
        count = layers - layers // int(text["sliding_window_pattern"])
    else:
        return 0, None
    return count, (int(window) if count else None)
