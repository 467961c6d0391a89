"""One rank's share of the model, for the memory plan (`stages/kv/plan.py`).

Tensor parallel: each rank holds 1/N of every layer's weights and of its
KV heads (mlx-lm's `shard` splits heads and MLP rows), and all of the
embedding and output head, which it does not split. Pipeline: each rank
holds its run of layers, at most ceil(L/N), with their KV, and the
embedding and head too. The embedding's size is estimated from the
config (vocabulary x hidden size at the config's dtype), capped at the
weights; /fit shows the result.
"""

from __future__ import annotations

import math

import attrs

from stages.kv.shape import ModelShape


def per_rank(shape: ModelShape, *, mode: str, ranks: int, vocab_size: int) -> ModelShape:
    embedding = min(shape.weights_bytes, vocab_size * shape.hidden_size * shape.dtype_bytes)
    layers_bytes = shape.weights_bytes - embedding
    if mode == "tensor":
        return attrs.evolve(
            shape, weights_bytes=embedding + math.ceil(layers_bytes / ranks), kv_heads=max(1, shape.kv_heads // ranks)
        )
    layers = math.ceil(shape.layers / ranks)
    share = layers / shape.layers if shape.layers else 1.0
    return attrs.evolve(
        shape,
        weights_bytes=embedding + math.ceil(layers_bytes * share),
        layers=layers,
        sliding_layers=min(layers, math.ceil(shape.sliding_layers * share)),
    )
