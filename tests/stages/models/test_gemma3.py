"""The `gemma3` built-in: Gemma 3 270M's GGUF converted to mlx-lm, held against independent readings.

The tensor names against the `gguf` package's own map for Gemma 3; the
first layers against a numpy forward pass that follows llama.cpp's
Gemma 3 graph on the file's values as stored (decoded by `gguf`, norms
with their added 1, its RoPE bases and sliding pattern); the memory plan
against the caches mlx-lm makes; and the model itself, as the engine
serves it on this backend, against a fact.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from pipeline.settings import Settings
from stages.engine.decisions import plan_memory
from stages.kv.shape import read_model_shape
from stages.models.gemma3_wheels import TEMPLATE_SHA256
from stages.models.gguf_file import GGUFTensor, read_gguf_file
from stages.models.gguf_gemma3 import gemma3_name
from stages.models.loading import Tokenizer, load_tokenizer, load_weights, resolve_model

LAYERS, HIDDEN, WINDOW = 18, 640, 512
# Every sixth layer attends globally: 5, 11 and 17.
GLOBAL_LAYERS = 3
REFERENCE_LAYERS = 6
PROMPT = "The capital of France is Paris, and the capital of Italy is"


@pytest.fixture(scope="module")
def config(gemma3_model: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((gemma3_model / "config.json").read_text())
    return loaded


# Tests that load the model are marked slow: its float32 weights and 262k-token tokenizer take seconds.
@pytest.fixture(scope="module")
def served(gemma3_model: Path) -> tuple[Any, Tokenizer]:
    """The model in the form the engine serves it on this backend (float32 on the CPU), and its tokenizer."""
    info, _, _ = plan_memory(Settings(), resolve_model("gemma3"), adapter_bytes=0, cluster=None)
    assert info.path == gemma3_model
    return load_weights(info), load_tokenizer(info)


def test_the_config_is_gemma_3_270ms(config: dict[str, Any]) -> None:
    shape = {key: config[key] for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")}
    assert shape == {
        "num_hidden_layers": LAYERS,
        "hidden_size": HIDDEN,
        "intermediate_size": 2048,
        "vocab_size": 262144,
    }
    attention = ("num_attention_heads", "num_key_value_heads", "head_dim", "query_pre_attn_scalar")
    assert [config[key] for key in attention] == [4, 1, 256, 256]
    windows = ("sliding_window", "sliding_window_pattern", "rope_theta", "rope_local_base_freq")
    assert [config[key] for key in windows] == [WINDOW, 6, 1_000_000.0, 10_000.0]
    assert (config["model_type"], config["rms_norm_eps"], config["tie_word_embeddings"]) == ("gemma3_text", 1e-6, True)
    # The base model's own <eos>, and the turn's end its chat template writes.
    assert config["eos_token_id"] == [1, 106]


def test_tensor_names_agree_with_the_gguf_packages_gemma3_map(gemma3_gguf: Path) -> None:
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, LAYERS)
    for name in read_gguf_file(gemma3_gguf).tensors:
        assert names.get_name(gemma3_name(name).removesuffix(".weight")) == name.removesuffix(".weight")


def test_norms_lose_the_one_llama_cpp_added(gemma3_gguf: Path, gemma3_model: Path) -> None:
    stored = read_gguf_file(gemma3_gguf).tensors["blk.3.post_ffw_norm.weight"].data.view(np.float32)
    weights = mx.load(str(gemma3_model / "model.safetensors"))
    assert isinstance(weights, dict)
    converted = np.array(weights["model.layers.3.post_feedforward_layernorm.weight"].astype(mx.float32))
    np.testing.assert_allclose(converted, np.asarray(stored, dtype=np.float64) - 1.0, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_the_chat_template_is_chatlints_and_turns_end_the_reply(
    gemma3_model: Path, served: tuple[Any, Tokenizer]
) -> None:
    template = (gemma3_model / "chat_template.jinja").read_bytes()
    assert hashlib.sha256(template).hexdigest() == TEMPLATE_SHA256
    tokenizer = served[1]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert tokenizer.eos_token_ids == {1, 106}
    assert "Gemma Terms of Use" in (gemma3_model / "GEMMA_TERMS.html").read_text(encoding="utf-8")


def test_the_memory_plan_counts_only_the_global_layers_past_the_window(gemma3_model: Path) -> None:
    shape = read_model_shape(gemma3_model, context_window=32768)
    assert (shape.layers, shape.sliding_layers, shape.sliding_window) == (LAYERS, LAYERS - GLOBAL_LAYERS, WINDOW)
    # One token's keys and values in one layer: 1 KV head x 256 dims x 2 x float16.
    assert shape.layer_token_bytes == 1024
    assert shape.kv_bytes_per_token == GLOBAL_LAYERS * shape.layer_token_bytes
    assert shape.kv_bytes(WINDOW) == LAYERS * WINDOW * shape.layer_token_bytes
    assert shape.kv_bytes(4 * WINDOW) - shape.kv_bytes(2 * WINDOW) == 2 * WINDOW * shape.kv_bytes_per_token


@pytest.mark.slow
def test_the_caches_mlx_lm_makes_are_the_ones_the_plan_counts(served: tuple[Any, Tokenizer]) -> None:
    from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

    caches = make_prompt_cache(served[0])
    rotating = [i for i, cache in enumerate(caches) if isinstance(cache, RotatingKVCache)]
    assert len(caches) == LAYERS and all(caches[i].max_size == WINDOW for i in rotating)
    assert [i for i, cache in enumerate(caches) if type(cache) is KVCache] == [5, 11, 17]


@pytest.mark.slow
def test_the_first_layers_match_an_independent_numpy_forward(gemma3_gguf: Path, served: tuple[Any, Tokenizer]) -> None:
    model, tokenizer = served
    tokens = tokenizer.encode(PROMPT)
    layers = model.model.layers
    try:
        model.model.layers = layers[:REFERENCE_LAYERS]
        ours = np.array(model.model(mx.array([tokens]))[0].astype(mx.float32))
    finally:
        model.model.layers = layers
    reference = _reference_hidden(read_gguf_file(gemma3_gguf).tensors, tokens)
    # The served float32 weights are MLX's dequantization in the stored scales' float16: each weight within
    # float16's rounding of llama.cpp's value, which leaves each token's state within 0.3% of the reference
    # (a wrong RoPE base, norm or scale moves it by percents).
    error = np.linalg.norm(ours - reference, axis=-1) / np.linalg.norm(reference, axis=-1)
    assert error.max() < 3e-3


@pytest.mark.slow
def test_the_base_model_completes_the_capital_of_france_with_paris(served: tuple[Any, Tokenizer]) -> None:
    from mlx_lm import generate

    model, tokenizer = served
    prompt = "The capital of Italy is Rome. The capital of France is"
    assert generate(model, tokenizer, prompt, max_tokens=3, verbose=False).startswith(" Paris")
    # Alone, the base model's likeliest next words are " the" and " a" ("the capital of the country of France"),
    # with " Paris" close behind: the independent forward above gives the same ranking.
    logits = model(mx.array([tokenizer.encode("The capital of France is")]))[0, -1]
    likeliest = mx.argsort(-logits)[:3].tolist()
    assert isinstance(likeliest, list) and tokenizer.encode(" Paris", add_special_tokens=False)[0] in likeliest


def _reference_hidden(tensors: dict[str, GGUFTensor], tokens: list[int]) -> np.ndarray:
    """llama.cpp's Gemma 3 graph in numpy, its first layers then the output norm, on `gguf`'s decoding."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    def weight(name: str) -> np.ndarray:
        tensor = tensors[name]
        rows = tensor.data.reshape(tensor.shape[0], -1) if len(tensor.shape) > 1 else tensor.data
        return np.asarray(dequantize(rows, GGMLQuantizationType(tensor.kind)), dtype=np.float64).reshape(tensor.shape)

    embedding = tensors["token_embd.weight"]
    rows = embedding.data.reshape(embedding.shape[0], -1)[tokens]
    # Gemma's embedding scale, rounded to bfloat16 as transformers and mlx-lm round it (llama.cpp does not).
    x = np.asarray(dequantize(rows, GGMLQuantizationType.Q8_0), dtype=np.float64) * 25.25
    for layer in range(REFERENCE_LAYERS):
        x = _reference_layer(weight, f"blk.{layer}.", x, base=1e6 if layer % 6 == 5 else 1e4)
    return np.asarray(_rms(x, weight("output_norm.weight")), dtype=np.float64)


def _reference_layer(weight: Any, p: str, x: np.ndarray, base: float) -> np.ndarray:
    length = len(x)
    h = _rms(x, weight(p + "attn_norm.weight"))
    q = _rms((h @ weight(p + "attn_q.weight").T).reshape(length, 4, 256), weight(p + "attn_q_norm.weight"))
    k = _rms((h @ weight(p + "attn_k.weight").T).reshape(length, 1, 256), weight(p + "attn_k_norm.weight"))
    v = np.repeat((h @ weight(p + "attn_v.weight").T).reshape(length, 1, 256), 4, axis=1)
    q, k = _rope_halves(q, base), np.repeat(_rope_halves(k, base), 4, axis=1)
    scores = np.einsum("thd,uhd->htu", q, k) / 16.0 + np.triu(np.full((length, length), -np.inf), 1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    attended = np.einsum("htu,uhd->thd", probs / probs.sum(-1, keepdims=True), v).reshape(length, -1)
    x = x + _rms(attended @ weight(p + "attn_output.weight").T, weight(p + "post_attention_norm.weight"))
    h = _rms(x, weight(p + "ffn_norm.weight"))
    gate, up = h @ weight(p + "ffn_gate.weight").T, h @ weight(p + "ffn_up.weight").T
    gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)))
    down = _rms((gelu * up) @ weight(p + "ffn_down.weight").T, weight(p + "post_ffw_norm.weight"))
    return np.asarray(x + down, dtype=np.float64)


def _rms(x: np.ndarray, gain: np.ndarray) -> np.ndarray:
    # GGUF's Gemma norms hold 1 + w already.
    return np.asarray(x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * gain, dtype=np.float64)


def _rope_halves(x: np.ndarray, base: float) -> np.ndarray:
    # llama.cpp's LLAMA_ROPE_TYPE_NEOX, Gemma's: dimension i rotates with i + dims/2.
    length, _, dims = x.shape
    angles = np.arange(length)[:, None] * base ** (-np.arange(0, dims, 2) / dims)[None]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    first, second = x[..., : dims // 2], x[..., dims // 2 :]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
