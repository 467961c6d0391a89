"""A llama-architecture GGUF file → an ordinary mlx-lm model directory.

`mx.load` reads GGUF: Q4_0, Q4_1 and Q8_0 tensors come back as MLX affine
quantized triples (`weight` uint32, `scales`, `biases`, group size 32) that
dequantize bit-exactly to llama.cpp's values, other types as float16. So
the conversion moves no numbers through float: it renames tensors to
mlx-lm's `llama` names, undoes the Q/K row order llama.cpp's converter
applies, and writes `config.json` (with mlx-lm's `quantization` section,
per module where bits differ), the tokenizer (`stages/models/gguf_vocab.py`)
and `model.safetensors`. `mlx_lm.load` then reads the directory as it reads
any community MLX conversion.

Supported: `general.architecture = llama` with a GPT-2 byte-level BPE
vocabulary. Anything else is refused with a message naming it, never
converted into a model that answers wrongly.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import mlx.core as mx

from stages.models.gguf_vocab import write_tokenizer

# mlx's GGUF reader packs every quantized type it keeps in groups of 32.
GGUF_GROUP_SIZE = 32
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|scales|biases|bias)")
_TOP = re.compile(r"(\w+)\.(weight|scales|biases|bias)")


class GGUFError(ValueError):
    """The GGUF file holds something this converter does not support."""


class Shaped(Protocol):
    """An array as `quantization_config` reads it: an MLX array or a numpy one."""

    @property
    def shape(self) -> tuple[int, ...]: ...


def convert_gguf(source: Path, dest: Path) -> None:
    """Write the mlx-lm model directory for GGUF file `source` into `dest`.

    Raises:
        GGUFError: not a llama-architecture GGUF with a GPT-2 BPE vocabulary,
            or it uses a feature (RoPE scaling, unknown tensors) not converted.
    """
    tensors, metadata = read_gguf(source)
    config = model_config(metadata)
    weights = mlx_weights(tensors, config)
    # Without an `output` tensor the head is the embedding matrix.
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    config.update(quantization_config(weights))
    write_tokenizer(metadata, dest)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_weights(dest, weights)


def save_weights(dest: Path, weights: Mapping[str, Any]) -> None:
    """`model.safetensors` in `dest`: the MLX or numpy arrays under their names, as mlx-lm writes its own."""
    arrays = {name: value if isinstance(value, mx.array) else mx.array(value) for name, value in weights.items()}
    mx.save_safetensors(str(dest / "model.safetensors"), arrays, metadata={"format": "mlx"})


def read_gguf(source: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """The tensors and metadata of a GGUF file, as `mx.load` reads them."""
    loaded = mx.load(str(source), return_metadata=True)
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], dict)):
        raise GGUFError(f"{source} did not load as a GGUF file")
    return loaded[0], dict(loaded[1])


def model_config(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """mlx-lm's `llama` config from GGUF metadata (without `quantization`)."""
    arch = _text(metadata, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"GGUF architecture {arch!r} is not supported; only 'llama' is")
    if _text(metadata, "llama.rope.scaling.type", "none") != "none":
        raise GGUFError("GGUF RoPE scaling is not supported")

    def number(key: str, default: float | None = None) -> Any:
        if f"llama.{key}" not in metadata:
            if default is None:
                raise GGUFError(f"GGUF metadata has no llama.{key}")
            return default
        return _scalar(metadata[f"llama.{key}"])

    hidden, heads = int(number("embedding_length")), int(number("attention.head_count"))
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(number("block_count")),
        "intermediate_size": int(number("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(number("attention.head_count_kv", heads)),
        "head_dim": int(number("rope.dimension_count", hidden // heads)),
        # GGUF stores it as float32: 1e-5 reads back as 9.99999974738e-06.
        "rms_norm_eps": float(f"{number('attention.layer_norm_rms_epsilon'):.7g}"),
        "vocab_size": len(metadata["tokenizer.ggml.tokens"]),
        "max_position_embeddings": int(number("context_length")),
        "rope_theta": float(number("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": int(_scalar(metadata["tokenizer.ggml.bos_token_id"])),
        "eos_token_id": int(_scalar(metadata["tokenizer.ggml.eos_token_id"])),
    }


def mlx_weights(tensors: Mapping[str, mx.array], config: Mapping[str, Any]) -> dict[str, mx.array]:
    """GGUF tensors renamed to mlx-lm's llama names, Q/K rows back in HF order."""
    weights: dict[str, mx.array] = {}
    for name, value in tensors.items():
        mapped = mlx_name(name)
        if mapped.endswith(("q_proj.weight", "q_proj.scales", "q_proj.biases")):
            value = unpermute_rows(value, config["num_attention_heads"])
        elif mapped.endswith(("k_proj.weight", "k_proj.scales", "k_proj.biases")):
            value = unpermute_rows(value, config["num_key_value_heads"])
        weights[mapped] = value
    return weights


def mlx_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`.

    Raises:
        GGUFError: a tensor this converter does not know.
    """
    block = _BLOCK.fullmatch(gguf_name)
    if block and block[2] in _LAYER_NAMES:
        return f"model.layers.{block[1]}.{_LAYER_NAMES[block[2]]}.{block[3]}"
    top = _TOP.fullmatch(gguf_name)
    if top and top[1] in _TOP_NAMES:
        return f"{_TOP_NAMES[top[1]]}.{top[2]}"
    raise GGUFError(f"GGUF tensor {gguf_name!r} has no mlx-lm llama counterpart")


def permute_rows(rows: mx.array, heads: int) -> mx.array:
    """llama.cpp's converter's Q/K row order: each head's two RoPE halves interleaved.

    HF llama rotates the first half of a head against the second; GGUF
    llama rotates adjacent pairs, so `convert_hf_to_gguf.py` reorders the
    rows of `q_proj`/`k_proj`. Any per-row array (weights, quantized
    scales and biases) is reordered the same way.
    """
    shape = rows.shape
    return rows.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def unpermute_rows(rows: mx.array, heads: int) -> mx.array:
    """The inverse of `permute_rows`: GGUF's Q/K rows back to HF order."""
    shape = rows.shape
    return rows.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def quantization_config(weights: Mapping[str, Shaped]) -> dict[str, Any]:
    """mlx-lm's `quantization` section: the common bits, and modules that differ.

    mlx-lm quantizes a module whose `<path>.scales` is present with the
    top-level `group_size`/`bits` unless the section names its path.
    """
    bits = {
        name.removesuffix(".scales"): _bits(weights[name.removesuffix(".scales") + ".weight"], scales)
        for name, scales in weights.items()
        if name.endswith(".scales")
    }
    if not bits:
        return {}
    common = Counter(bits.values()).most_common(1)[0][0]
    section: dict[str, Any] = {"group_size": GGUF_GROUP_SIZE, "bits": common, "mode": "affine"}
    section.update(
        {
            path: {"group_size": GGUF_GROUP_SIZE, "bits": b, "mode": "affine"}
            for path, b in sorted(bits.items())
            if b != common
        }
    )
    return {"quantization": section, "quantization_config": section}


def _bits(packed: Shaped, scales: Shaped) -> int:
    # uint32 words per row × 32 bits = values per row × bits.
    return packed.shape[-1] * 32 // (scales.shape[-1] * GGUF_GROUP_SIZE)


def _text(metadata: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = metadata.get(key, default)
    if not isinstance(value, str):
        raise GGUFError(f"GGUF metadata has no text {key}")
    return value


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, mx.array) else value
