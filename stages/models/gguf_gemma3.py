"""A Gemma 3 GGUF file → an ordinary mlx-lm `gemma3_text` model directory.

The file is read with numpy (`stages/models/gguf_file.py`: `mx.load`
cannot read K-quants). Q8_0 and Q5_0 tensors become MLX affine triples
that dequantize to llama.cpp's values exactly; Q4_K and Q6_K tensors,
whose sub-blocks MLX cannot express, are dequantized as llama.cpp does
(`stages/models/gguf_quants.py`) and stored as float16, the dtype of the
triples' scales, so the model computes in one dtype. The tokenizer is the
GGUF's SentencePiece vocabulary rebuilt with `tokenizers`
(`stages/models/gguf_spm.py`).

What llama.cpp's converter changed is undone here: it stores Gemma's
RMSNorm weights with the 1 of their `(1 + w)` already added (mlx-lm, like
transformers, adds it at run time). Gemma's RoPE rotates a head's two
halves on both sides, so Q/K rows keep their order (unlike llama's). What
GGUF does not carry is llama.cpp's Gemma 3 constants, written here: every
sixth layer global, local RoPE base 10,000, queries scaled by the head
size (the 27B's by hidden size over heads).

Takes a GGUF path and a chat template (the base model's GGUF carries
none); writes config.json, model.safetensors and the tokenizer files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stages.models.gguf import GGUFError, quantization_config, save_weights
from stages.models.gguf_file import GGUFTensor, read_gguf_file
from stages.models.gguf_quants import dequantize, mlx_affine
from stages.models.gguf_spm import build_spm_tokenizer, special_names

# llama.cpp's LLM_ARCH_GEMMA3 constants, which its GGUF files do not store.
SLIDING_WINDOW_PATTERN = 6
LOCAL_ROPE_BASE = 10_000.0
# The 27B's depth: llama.cpp scales its queries by hidden size over heads, every other size by the head size.
_GEMMA3_27B_LAYERS = 62
END_OF_TURN = "<end_of_turn>"
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
_TOP = re.compile(r"(\w+)\.weight")


def convert_gemma3_gguf(source: Path, dest: Path, chat_template: str) -> None:
    """Write the mlx-lm model directory for Gemma 3 GGUF file `source` into `dest`.

    Raises:
        GGUFError: not a Gemma 3 GGUF, or a tensor or feature not converted.
    """
    gguf = read_gguf_file(source)
    config = gemma3_config(gguf.metadata)
    weights = gemma3_weights(gguf.tensors)
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    config.update(quantization_config(weights))
    write_spm_tokenizer(gguf.metadata, dest, chat_template, context=config["max_position_embeddings"])
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_weights(dest, weights)


def gemma3_config(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """mlx-lm's `gemma3_text` config from GGUF metadata (without `quantization`).

    Raises:
        GGUFError: not a Gemma 3 GGUF, a key it needs is missing, or a
            feature (keys and values of other sizes, RoPE scaling other
            than linear) is not converted.
    """
    if metadata.get("general.architecture") != "gemma3":
        raise GGUFError(f"GGUF architecture {metadata.get('general.architecture')!r} is not 'gemma3'")
    hidden, heads = int(_number(metadata, "embedding_length")), int(_number(metadata, "attention.head_count"))
    layers, head_dim = int(_number(metadata, "block_count")), int(_number(metadata, "attention.key_length"))
    if int(_number(metadata, "attention.value_length", head_dim)) != head_dim:
        raise GGUFError("GGUF Gemma 3 keys and values of different sizes are not supported")
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": int(_number(metadata, "feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_number(metadata, "attention.head_count_kv", heads)),
        "head_dim": head_dim,
        # GGUF stores it as float32: 1e-6 reads back as 9.99999997e-07.
        "rms_norm_eps": float(f"{_number(metadata, 'attention.layer_norm_rms_epsilon'):.7g}"),
        "max_position_embeddings": int(_number(metadata, "context_length")),
        "rope_theta": float(_number(metadata, "rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": float(_number(metadata, "rope.freq_base_swa", LOCAL_ROPE_BASE)),
        "rope_scaling": _rope_scaling(metadata),
        "query_pre_attn_scalar": hidden // heads if layers == _GEMMA3_27B_LAYERS else head_dim,
        "sliding_window": int(_number(metadata, "attention.sliding_window")),
        "sliding_window_pattern": SLIDING_WINDOW_PATTERN,
        "hidden_activation": "gelu_pytorch_tanh",
        "torch_dtype": "float16",
        **_token_ids(metadata),
    }


def _number(metadata: Mapping[str, Any], key: str, default: float | None = None) -> Any:
    value = metadata.get(f"gemma3.{key}", default)
    if value is None:
        raise GGUFError(f"GGUF metadata has no gemma3.{key}")
    return value


def _token_ids(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The vocabulary's size and special ids; EOS also names the turn's end its chat template writes."""
    tokens = metadata["tokenizer.ggml.tokens"]
    turn_end = [tokens.index(END_OF_TURN)] if END_OF_TURN in tokens else []
    return {
        "vocab_size": len(tokens),
        "bos_token_id": int(metadata["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": [int(metadata["tokenizer.ggml.eos_token_id"]), *turn_end],
        "pad_token_id": int(metadata.get("tokenizer.ggml.padding_token_id", 0)),
    }


def _rope_scaling(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = metadata.get("gemma3.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(metadata["gemma3.rope.scaling.factor"])}
    raise GGUFError(f"GGUF RoPE scaling {kind!r} is not supported")


def gemma3_weights(tensors: Mapping[str, GGUFTensor]) -> dict[str, np.ndarray[Any, Any]]:
    """The tensors under mlx-lm's names: exact triples where MLX has the form, float16 elsewhere."""
    weights: dict[str, np.ndarray[Any, Any]] = {}
    for name, tensor in tensors.items():
        mapped = gemma3_name(name).removesuffix(".weight")
        triple = mlx_affine(tensor)
        if triple is not None:
            for part, value in zip(("weight", "scales", "biases"), triple):
                weights[f"{mapped}.{part}"] = value
            continue
        values = dequantize(tensor)
        if mapped.endswith("norm"):
            # llama.cpp's converter stored Gemma's 1 + w; mlx-lm's RMSNorm adds the 1 itself.
            values = values - np.float32(1.0)
        weights[f"{mapped}.weight"] = values.astype(np.float16)
    return weights


def gemma3_name(gguf_name: str) -> str:
    """`blk.3.post_ffw_norm.weight` → `model.layers.3.post_feedforward_layernorm.weight`.

    Raises:
        GGUFError: a tensor this converter does not know.
    """
    block = _BLOCK.fullmatch(gguf_name)
    if block and block[2] in _LAYER_NAMES:
        return f"model.layers.{block[1]}.{_LAYER_NAMES[block[2]]}.weight"
    top = _TOP.fullmatch(gguf_name)
    if top and top[1] in _TOP_NAMES:
        return f"{_TOP_NAMES[top[1]]}.weight"
    raise GGUFError(f"GGUF tensor {gguf_name!r} has no mlx-lm gemma3_text counterpart")


def write_spm_tokenizer(metadata: Mapping[str, Any], dest: Path, chat_template: str, *, context: int) -> None:
    """`tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja` into `dest`."""
    build_spm_tokenizer(metadata).save(str(dest / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_names(metadata),
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "model_max_length": context,
        "clean_up_tokenization_spaces": False,
    }
    text = json.dumps(config, indent=2, ensure_ascii=False)
    (dest / "tokenizer_config.json").write_text(text + "\n", encoding="utf-8")
    (dest / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
