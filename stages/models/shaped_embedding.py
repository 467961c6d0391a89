"""Random-weight embedding models at Qwen3-Embedding's published shape, laid out as published.

`MLX_RELAY_EMBEDDING_MODEL=shaped:qwen3-embedding-0.6b-2l` (tests) or
`shaped:qwen3-embedding-0.6b` (the full 28 layers, benchmarks) serves one.
What is true to Qwen/Qwen3-Embedding-0.6B, so the loading path a real
download takes is the one tested:

- `config.json`: the published figures (Qwen3, hidden 1024, 16 heads, 8
  KV heads, head dim 128, MLP 3072, 32768 positions, tied embeddings) and
  no Matryoshka declaration (the model card promises sizes 32-1024, the
  config does not say so: `MLX_RELAY_EMBEDDING_MATRYOSHKA` declares it);
- the weights as transformers saves the published `Qwen3Model`: headless,
  no `model.` prefix, no `lm_head`, unquantized;
- sentence-transformers' `modules.json` (Transformer, Pooling, Normalize)
  and `1_Pooling/config.json` with last-token pooling.

Not true to it: the vocabulary is the demo model's 8192-token BPE (as for
every shaped model, `stages/models/shaped.py`), and the weights are random.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

from stages.models.demo import EOS_TOKENS, write_tokenizer
from stages.models.publish import build_once, default_cache_root

BUILDER_VERSION = "v1"
_SEED = 5309
_VOCAB = 8192

# https://huggingface.co/Qwen/Qwen3-Embedding-0.6B/blob/main/config.json
QWEN3_EMBEDDING_0_6B: Mapping[str, Any] = MappingProxyType(
    {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 28,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "attention_bias": False,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    }
)
# name → (layers, dtype): float32 for the small one, as shaped.py does (MLX's CPU backend is slow in bfloat16).
MODELS: Mapping[str, tuple[int, str]] = MappingProxyType(
    {"qwen3-embedding-0.6b": (28, "bfloat16"), "qwen3-embedding-0.6b-2l": (2, "float32")}
)
_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def ensure_embedding_model(name: str, cache_root: Path | None = None) -> Path:
    """The directory of shaped embedding model `name` (a key of `MODELS`), built first if not cached."""
    root = cache_root if cache_root is not None else default_cache_root()
    layers, dtype = MODELS[name]
    return build_once(root / f"shaped-{name}-{BUILDER_VERSION}", partial(_build, layers, dtype))


def _build(layers: int, dtype: str, dest: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    context = int(QWEN3_EMBEDDING_0_6B["max_position_embeddings"])
    vocab = write_tokenizer(dest, _VOCAB, context)
    config = {
        **QWEN3_EMBEDDING_0_6B,
        "num_hidden_layers": layers,
        "vocab_size": len(vocab),
        "torch_dtype": dtype,
        "bos_token_id": vocab["<|endoftext|>"],
        "eos_token_id": [vocab[t] for t in EOS_TOKENS],
        "shaped_from": "Qwen/Qwen3-Embedding-0.6B",
    }
    mx.random.seed(_SEED)
    arch = importlib.import_module("mlx_lm.models.qwen3")
    model: Any = arch.Model(arch.ModelArgs.from_dict(config))
    # Headless, as transformers saves the published AutoModel: the decoder's weights without its prefix.
    flat: Any = tree_flatten(model.parameters())
    weights = {k.removeprefix("model."): v.astype(getattr(mx, dtype)) for k, v in flat if k.startswith("model.")}
    mx.eval(weights)
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "pt"})
    _write(dest / "config.json", config)
    _write(dest / "modules.json", _MODULES)
    pooling = {
        "word_embedding_dimension": config["hidden_size"],
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True,
        "include_prompt": True,
    }
    (dest / "1_Pooling").mkdir()
    _write(dest / "1_Pooling" / "config.json", pooling)
    (dest / "2_Normalize").mkdir()


def _write(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
