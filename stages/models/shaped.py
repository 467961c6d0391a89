"""Random-weight models at real architectures' published shapes, 4-bit like mlx-community's.

`ensure_shaped_model(name)` returns an ordinary mlx-lm model directory, as
`ensure_demo_model` does, for exercising what the demo model cannot: 4-bit
quantized kernels, real per-token KV sizes, and the caches that are not a
plain `KVCache` (sliding-window `RotatingKVCache`, recurrent `ArraysCache`).

- The figures (hidden size, heads, KV heads, head dim, MLP width, window,
  recurrent-layer sizes, context window) are copied from each model's
  published `config.json`; `SHAPES` names the Hugging Face repo. A name with
  an `-<n>l` suffix keeps only the first n layers (the cache pattern, e.g.
  Gemma 3's five sliding layers and one global, is kept whole).
- Quantized with mlx-lm's own path (`quantize_model`: affine, 4 bits,
  group 64, the mlx-community default), so `config.json` carries the same
  `quantization` block a converted model does.
- The vocabulary is the demo model's 8192-token BPE (and its ChatML
  template), not the real 150k-260k: every id the model can emit must
  decode, and a real-size random embedding would add seconds of building
  and 80-170 MB per model for no shape that matters to the cache or the
  scheduler (KV per token does not depend on the vocabulary).

Owns: `<cache root>/shaped-<name>-<BUILDER_VERSION>/`, built into a temporary
sibling and renamed into place like the demo models.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from stages.models.demo import EOS_TOKENS, MARKER_TOKENS, SPECIAL_TOKENS, write_tokenizer
from stages.models.publish import build_once, default_cache_root

BUILDER_VERSION = "v1"
# `MLX_RELAY_MODEL=shaped:<name>` serves one of these.
PREFIX = "shaped:"
DEMO_VOCAB = 8192
_SEED = 4321
_GROUP_SIZE, _BITS = 64, 4


@attrs.frozen(kw_only=True)
class Shape:
    repo: str
    # The published config.json figures (all but the vocabulary).
    config: Mapping[str, Any]
    # The published depth; a model built with fewer layers keeps the pattern's start.
    depth: int
    # Input and output embeddings are one matrix (the published `tie_word_embeddings`).
    tied: bool
    # The cache mlx-lm makes for it, for tables and tests.
    cache: str


SHAPES: Mapping[str, Shape] = MappingProxyType(
    {
        # https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json
        "qwen3-0.6b": Shape(
            repo="Qwen/Qwen3-0.6B",
            depth=28,
            tied=True,
            cache="plain",
            config={
                "model_type": "qwen3",
                "hidden_size": 1024,
                "intermediate_size": 3072,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "max_position_embeddings": 40960,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000,
                "attention_bias": False,
                "hidden_act": "silu",
                "torch_dtype": "bfloat16",
            },
        ),
        # https://huggingface.co/google/gemma-3-1b-it/blob/main/config.json
        # Every sixth layer is global (KVCache); the others slide over 512 tokens (RotatingKVCache).
        "gemma3-1b": Shape(
            repo="google/gemma-3-1b-it",
            depth=26,
            tied=True,
            cache="rotating",
            config={
                "model_type": "gemma3_text",
                "hidden_size": 1152,
                "intermediate_size": 6912,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "head_dim": 256,
                "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000,
                "rope_local_base_freq": 10000,
                "query_pre_attn_scalar": 256,
                "sliding_window": 512,
                "sliding_window_pattern": 6,
                "hidden_activation": "gelu_pytorch_tanh",
                "torch_dtype": "bfloat16",
            },
        ),
        # https://huggingface.co/Qwen/Qwen3.5-0.8B/blob/main/config.json (its text_config)
        # Three gated-delta (recurrent, ArraysCache) layers, then one full-attention (KVCache).
        "qwen3.5-0.8b": Shape(
            repo="Qwen/Qwen3.5-0.8B",
            depth=24,
            tied=True,
            cache="recurrent",
            config={
                "model_type": "qwen3_5_text",
                "hidden_size": 1024,
                "intermediate_size": 3584,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "head_dim": 256,
                "linear_num_key_heads": 16,
                "linear_num_value_heads": 16,
                "linear_key_head_dim": 128,
                "linear_value_head_dim": 128,
                "linear_conv_kernel_dim": 4,
                "full_attention_interval": 4,
                "attn_output_gate": True,
                "max_position_embeddings": 262144,
                "rms_norm_eps": 1e-6,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000000,
                    "partial_rotary_factor": 0.25,
                    "mrope_section": [11, 11, 10],
                    "mrope_interleaved": True,
                },
                "torch_dtype": "bfloat16",
            },
        ),
    }
)

# The names served and built: each shape at full depth, and the small-depth
# versions the tests and CPU benchmarks use.
# versions the tests and CPU benchmarks use. Full-depth models are bfloat16
# like the published weights, so their KV per token is the real one; the
# small ones are float32, because MLX's CPU backend runs bfloat16 quantized
# matmuls about ten times slower than float32 ones (their KV per token is
# twice the real one).
MODELS: Mapping[str, tuple[str, int, str]] = MappingProxyType(
    {
        "qwen3-0.6b": ("qwen3-0.6b", 28, "bfloat16"),
        "qwen3-0.6b-2l": ("qwen3-0.6b", 2, "float32"),
        "gemma3-1b-6l": ("gemma3-1b", 6, "float32"),
        "qwen3.5-0.8b-4l": ("qwen3.5-0.8b", 4, "float32"),
    }
)


def ensure_shaped_model(name: str, cache_root: Path | None = None) -> Path:
    """The directory of shaped model `name` (a key of `MODELS`), built first if not cached.

    Raises:
        ValueError: `name` is not a shaped model.
        OSError: the cache root cannot be written.
    """
    from stages.models import shaped_embedding

    if name in shaped_embedding.MODELS:
        return shaped_embedding.ensure_embedding_model(name, cache_root)
    if name not in MODELS:
        raise ValueError(f"unknown shaped model {name!r}; choose from {sorted([*MODELS, *shaped_embedding.MODELS])}")
    root = cache_root if cache_root is not None else default_cache_root()
    shape, layers, dtype = MODELS[name]
    return build_once(root / f"shaped-{name}-{BUILDER_VERSION}", partial(_build, SHAPES[shape], layers, dtype))


def model_config(shape: Shape, layers: int, vocab: Mapping[str, int]) -> dict[str, Any]:
    """The unquantized config.json of `shape` cut to `layers` layers, over the demo vocabulary."""
    if not 0 < layers <= shape.depth:
        raise ValueError(f"{shape.repo} has {shape.depth} layers, not {layers}")
    config = {
        **shape.config,
        "num_hidden_layers": layers,
        "vocab_size": len(vocab),
        "tie_word_embeddings": shape.tied,
        "bos_token_id": vocab["<|endoftext|>"],
        "eos_token_id": [vocab[t] for t in EOS_TOKENS],
        "shaped_from": shape.repo,
    }
    if config["model_type"] == "qwen3_5_text":
        # mlx-lm reads Qwen3.5 as its multimodal wrapper around a text_config.
        return {
            "model_type": "qwen3_5",
            "tie_word_embeddings": shape.tied,
            "text_config": config,
            "eos_token_id": config["eos_token_id"],
            "shaped_from": shape.repo,
        }
    return config


def _build(shape: Shape, layers: int, dtype: str, dest: Path) -> None:
    context = int(shape.config["max_position_embeddings"])
    vocab = write_tokenizer(dest, DEMO_VOCAB, context)
    config = model_config(shape, layers, vocab)
    (config.get("text_config") or config)["torch_dtype"] = dtype
    silenced = [vocab[t] for t in SPECIAL_TOKENS + MARKER_TOKENS]
    weights, config = _random_quantized(config, silenced, dtype)
    import mlx.core as mx

    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _random_quantized(
    config: dict[str, Any], silenced: Sequence[int], dtype: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import quantize_model

    mx.random.seed(_SEED)
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model: Any = arch.Model(arch.ModelArgs.from_dict(config))
    # In `dtype`, except what the architecture keeps in float32 (its
    # `cast_predicate`, e.g. Qwen3.5's A_log).
    keep = getattr(model, "cast_predicate", None) or (lambda _: True)
    flat: Any = tree_flatten(model.parameters())
    params = {k: v.astype(getattr(mx, dtype)) if keep(k) else v for k, v in flat}
    # As in the demo model: the control tokens' output rows are zero, so an EOS
    # comes now and then when sampling and almost never when greedy.
    suffix = "embed_tokens.weight" if config.get("tie_word_embeddings") else "lm_head.weight"
    head = next(key for key in params if key.endswith(suffix))
    params[head] = params[head].at[mx.array(list(silenced))].multiply(0.0)
    model.update(tree_unflatten(list(params.items())))
    # mlx-lm prints a bits-per-weight line; a build is quiet.
    with contextlib.redirect_stdout(io.StringIO()):
        model, config = quantize_model(model, config, _GROUP_SIZE, _BITS)
    weights = dict(tree_flatten(model.parameters()))
    if config.get("tie_word_embeddings"):
        # Gemma's mlx-lm class always has an lm_head and ties it when the file has none.
        weights = {k: v for k, v in weights.items() if not k.startswith("lm_head.")}
    mx.eval(weights)
    return weights, config


def main(argv: Sequence[str] | None = None) -> int:
    """Build (if needed) one shaped model and print its directory."""
    parser = argparse.ArgumentParser(prog="python -m stages.models.shaped", description=main.__doc__)
    parser.add_argument("--name", choices=sorted(MODELS), default="qwen3-0.6b")
    parser.add_argument(
        "--cache-root", type=Path, default=None, help="default: $MLX_RELAY_DEMO_CACHE or ~/.cache/mlx-relay"
    )
    args = parser.parse_args(argv)
    print(ensure_shaped_model(args.name, args.cache_root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
