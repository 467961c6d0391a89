"""SmolLM2 as converted against an independent reading of the same GGUF file.

The reference is numpy: the `gguf` package (llama.cpp's own Python reader)
dequantizes the tensors, and the forward pass follows llama.cpp's llama
graph on the file's rows as stored — Q/K in GGUF's interleaved order with
RoPE over adjacent pairs — so neither our tensor names, nor the row
un-permutation, nor mlx-lm's quantized kernels are shared with it. Only
the first layers run, to keep it quick: a wrong name, row order, group
size or norm shows at layer 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_model

from stages.models.smollm2 import gguf_path

LAYERS = 2
PROMPT = "The capital of France is Paris, and the capital of Italy is"


def _reference_weights(layers: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(gguf_path())
    wanted = ("token_embd.", "output_norm.", *(f"blk.{i}." for i in range(layers)))
    weights = {
        t.name: dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(d) for d in reversed(t.shape)])
        for t in reader.tensors
        if t.name.startswith(wanted)
    }

    def field(key: str) -> Any:
        part = reader.fields[key]
        return part.parts[part.data[0]][0]

    config = {
        "heads": int(field("llama.attention.head_count")),
        "kv_heads": int(field("llama.attention.head_count_kv")),
        "eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "base": float(field("llama.rope.freq_base")),
    }
    return weights, config


def _rms(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain


def _rope_adjacent_pairs(x: np.ndarray, base: float) -> np.ndarray:
    # llama.cpp's LLAMA_ROPE_TYPE_NORM: dimensions (2i, 2i+1) rotate together.
    length, _, dims = x.shape
    angles = np.arange(length)[:, None] * base ** (-np.arange(0, dims, 2) / dims)[None]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
    return out


def _attention(w: dict[str, np.ndarray], p: str, h: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    length, heads, kv_heads = len(h), config["heads"], config["kv_heads"]
    q = _rope_adjacent_pairs((h @ w[p + "attn_q.weight"].T).reshape(length, heads, -1), config["base"])
    k = _rope_adjacent_pairs((h @ w[p + "attn_k.weight"].T).reshape(length, kv_heads, -1), config["base"])
    v = (h @ w[p + "attn_v.weight"].T).reshape(length, kv_heads, -1)
    k, v = np.repeat(k, heads // kv_heads, axis=1), np.repeat(v, heads // kv_heads, axis=1)
    scores = np.einsum("thd,uhd->htu", q, k) / np.sqrt(q.shape[-1]) + np.triu(np.full((length, length), -np.inf), 1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("htu,uhd->thd", probs, v).reshape(length, -1) @ w[p + "attn_output.weight"].T


def _reference_logits(tokens: list[int], layers: int) -> np.ndarray:
    w, config = _reference_weights(layers)
    x = w["token_embd.weight"][tokens]
    for i in range(layers):
        p = f"blk.{i}."
        x = x + _attention(w, p, _rms(x, w[p + "attn_norm.weight"], config["eps"]), config)
        h = _rms(x, w[p + "ffn_norm.weight"], config["eps"])
        gate = h @ w[p + "ffn_gate.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    # Tied head: SmolLM2 has no output.weight.
    return np.asarray(_rms(x, w["output_norm.weight"], config["eps"]) @ w["token_embd.weight"].T)


def test_the_first_layers_match_an_independent_numpy_forward(smollm2_model: Path) -> None:
    from tokenizers import Tokenizer

    tokens = Tokenizer.from_file(str(smollm2_model / "tokenizer.json")).encode(PROMPT).ids
    model, _ = load_model(smollm2_model)
    model.model.layers = model.model.layers[:LAYERS]
    ours = np.array(model(mx.array([tokens]))[0].astype(mx.float32))
    reference = _reference_logits(tokens, LAYERS)
    assert (ours.argmax(-1) == reference.argmax(-1)).all()
    # mlx-lm computes in float16 (the GGUF's scales); the reference in float32.
    assert np.abs(ours - reference).max() < 0.01 * np.abs(reference).max() + 0.05
    assert min(np.corrcoef(a, b)[0, 1] for a, b in zip(ours, reference)) > 0.9999
