"""Embeddings and yes/no scores from the chat model, as chunked exclusive work.

Both run on the model thread through `stages/exclusive.py`. Inputs are
sorted by length and run in batches padded on the right: under causal
attention a real token never sees the padding after it, so an input's
hidden states are the same alone or in a batch (within float rounding),
and no mask is needed. A chunk takes inputs in that order while the
padded batch stays within its token allowance.

An embedding is the last layer's hidden states pooled over the input
(mean, or the last token's), L2-normalized. A score is the probability
the model gives "yes" over "yes" + "no" as the first token of its answer
to a judgement prompt (`stages/scoring.py` writes it), read off the last
prompt position only, so the head never runs over the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs
import numpy as np

from pipeline.errors import invalid
from stages.models.mlx_internals import final_hidden, head_logits

Pooling = Literal["mean", "last"]
# Rows in one forward pass, whatever their length.
_MAX_ROWS = 64
# Padded tokens in one forward pass when the step allows more: bounds its memory.
_MAX_TOKENS = 8192


@attrs.define
class _Batches:
    """Inputs in length order, taken a chunk at a time."""

    inputs: Sequence[Sequence[int]]
    order: list[int] = attrs.field(init=False)
    next: int = 0
    left: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.order = sorted(range(len(self.inputs)), key=lambda i: len(self.inputs[i]))
        self.left = sum(len(tokens) for tokens in self.inputs)

    def take(self, max_units: int) -> list[int]:
        """Indices of the next chunk: at least one input, the padded batch within the allowance."""
        allowance = min(max_units, _MAX_TOKENS)
        chosen = [self.order[self.next]]
        while self.next + len(chosen) < len(self.order) and len(chosen) < _MAX_ROWS:
            candidate = self.order[self.next + len(chosen)]
            # Sorted ascending: the candidate is the longest, so it sets the padded width.
            if len(self.inputs[candidate]) * (len(chosen) + 1) > allowance:
                break
            chosen.append(candidate)
        self.next += len(chosen)
        self.left -= sum(len(self.inputs[i]) for i in chosen)
        return chosen


def _padded(rows: list[Sequence[int]]) -> tuple[Any, list[int]]:
    import mlx.core as mx

    width = max(len(row) for row in rows)
    lengths = [len(row) for row in rows]
    batch = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return mx.array(batch), lengths


def _hidden(model: Any, batch: Any) -> Any:
    hidden = final_hidden(model, batch)
    if hidden is None:
        raise invalid("This model's architecture does not expose hidden states for embeddings", param="model")
    return hidden


@attrs.define
class EmbedWork:
    """Vectors for token inputs: `remaining` counts tokens still to run."""

    inputs: Sequence[Sequence[int]]
    pooling: Pooling
    _batches: _Batches = attrs.field(init=False)
    _vectors: list[np.ndarray[Any, Any] | None] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._batches = _Batches(self.inputs)
        self._vectors = [None] * len(self.inputs)

    def remaining(self) -> int:
        return self._batches.left

    def run_chunk(self, model: Any, max_units: int) -> int:
        import mlx.core as mx

        chosen = self._batches.take(max_units)
        batch, lengths = _padded([self.inputs[i] for i in chosen])
        hidden = _hidden(model, batch).astype(mx.float32)
        lengths_array = mx.array(lengths)
        if self.pooling == "mean":
            positions = mx.arange(hidden.shape[1])[None, :, None]
            mask = (positions < lengths_array[:, None, None]).astype(mx.float32)
            pooled = (hidden * mask).sum(axis=1) / lengths_array[:, None].astype(mx.float32)
        else:
            pooled = hidden[mx.arange(len(chosen)), lengths_array - 1]
        pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        result = np.array(pooled)
        for row, index in enumerate(chosen):
            self._vectors[index] = result[row]
        return int(batch.size)

    def result(self) -> list[np.ndarray[Any, Any]]:
        assert all(vector is not None for vector in self._vectors)
        return [vector for vector in self._vectors if vector is not None]


@attrs.define
class ScoreWork:
    """P(yes) / (P(yes) + P(no)) for each judgement prompt."""

    inputs: Sequence[Sequence[int]]
    yes: int
    no: int
    _batches: _Batches = attrs.field(init=False)
    _scores: list[float] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._batches = _Batches(self.inputs)
        self._scores = [0.0] * len(self.inputs)

    def remaining(self) -> int:
        return self._batches.left

    def run_chunk(self, model: Any, max_units: int) -> int:
        import mlx.core as mx

        chosen = self._batches.take(max_units)
        batch, lengths = _padded([self.inputs[i] for i in chosen])
        hidden = _hidden(model, batch)
        last = hidden[mx.arange(len(chosen)), mx.array(lengths) - 1]
        logits = head_logits(model, last)
        if logits is None:
            raise invalid("This model's output head cannot be read for scoring", param="model")
        pair = logits.astype(mx.float32)[:, mx.array([self.yes, self.no])]
        probabilities = np.array(mx.softmax(pair, axis=-1))
        for row, index in enumerate(chosen):
            self._scores[index] = float(probabilities[row, 0])
        return int(batch.size)

    def result(self) -> list[float]:
        return list(self._scores)
