"""A small Gemma 3 (mlx-lm's own class, random weights) whose sliding window is 8 tokens: tests reach past its
window, where its layers rotate, in a few steps."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models import gemma3_text

WINDOW = 8


def windowed_model() -> Any:
    """Three layers, two of them sliding (`RotatingKVCache`) and one global."""
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=3,
        intermediate_size=128,
        num_attention_heads=2,
        head_dim=32,
        vocab_size=256,
        num_key_value_heads=1,
        query_pre_attn_scalar=32,
        sliding_window=WINDOW,
        sliding_window_pattern=3,
    )
    mx.random.seed(3)
    built = gemma3_text.Model(args)
    mx.eval(built.parameters())
    return built
