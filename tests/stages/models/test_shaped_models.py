"""The shape-true models: published figures, mlx-community's quantization, and served by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.models.loading import resolve_model
from stages.models.shaped import MODELS, SHAPES, ensure_shaped_model


def test_the_small_qwen3_keeps_the_published_shape_and_is_4bit_group_64() -> None:
    path = ensure_shaped_model("qwen3-0.6b-2l")
    config = json.loads((path / "config.json").read_text())
    published = SHAPES["qwen3-0.6b"].config
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert config[key] == published[key], key
    assert config["num_hidden_layers"] == 2 and config["shaped_from"] == "Qwen/Qwen3-0.6B"
    assert config["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}


def test_a_shaped_model_is_served_by_name() -> None:
    info = resolve_model("shaped:qwen3-0.6b-2l")
    assert info.name == "mlx-relay/shaped:qwen3-0.6b-2l"
    assert info.context_window == 40960 and info.vocab_size == 8192
    assert info.path == ensure_shaped_model("qwen3-0.6b-2l")


def test_every_name_is_a_published_shape_at_or_under_its_depth() -> None:
    for shape, layers, dtype in MODELS.values():
        assert 0 < layers <= SHAPES[shape].depth and dtype in ("float32", "bfloat16")


def test_an_unknown_shaped_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown shaped model"):
        ensure_shaped_model("llama-405b", tmp_path)
