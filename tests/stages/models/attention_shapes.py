"""Queries, keys and values shaped as a model's attention gets them, shared by the CPU attention's tests."""

from __future__ import annotations

import mlx.core as mx


def shapes(batch: int, heads: int, kv_heads: int, rows: int, context: int, dim: int) -> tuple[mx.array, ...]:
    queries = mx.random.normal((batch, heads, rows, dim))
    # The cache hands attention a slice of its longer buffer, a strided view.
    keys = mx.random.normal((batch, kv_heads, context + 64, dim))[:, :, :context]
    values = mx.random.normal((batch, kv_heads, context + 64, dim))[:, :, :context]
    return queries, keys, values
