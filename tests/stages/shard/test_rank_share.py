"""A sharded rank plans for its own part of the model: its slice of the layers and KV, all of the embedding."""

from __future__ import annotations

from stages.kv.shape import ModelShape
from stages.shard.rank_share import per_rank

SHAPE = ModelShape(
    weights_bytes=1_000_000_000,
    layers=28,
    kv_heads=8,
    head_dim=128,
    attention_heads=16,
    hidden_size=1024,
    intermediate_size=3072,
    dtype_bytes=2,
    context_window=40960,
)
VOCAB = 151_936
EMBEDDING = VOCAB * 1024 * 2


def test_tensor_parallel_splits_the_layers_and_kv_heads_but_not_the_embedding() -> None:
    rank = per_rank(SHAPE, mode="tensor", ranks=2, vocab_size=VOCAB)
    assert rank.kv_heads == 4
    assert rank.kv_bytes_per_token * 2 == SHAPE.kv_bytes_per_token
    assert rank.weights_bytes == EMBEDDING + (SHAPE.weights_bytes - EMBEDDING) // 2


def test_pipeline_holds_its_run_of_layers() -> None:
    rank = per_rank(SHAPE, mode="pipeline", ranks=3, vocab_size=VOCAB)
    assert rank.layers == 10
    assert rank.kv_heads == 8
    assert EMBEDDING < rank.weights_bytes < SHAPE.weights_bytes
