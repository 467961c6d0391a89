"""Embeddings and yes/no scores from the chat model, as chunked exclusive work.

Both run on the model thread through `stages/model_thread/exclusive.py`. Inputs are
sorted by length and run in groups padded on the right: under causal
attention a real token never sees the padding after it, so an input's
hidden states are the same alone or in a group (within float rounding),
and no mask is needed. A group runs a slice of columns at a time over a
KV cache, as a chunked prefill does, so one chunk of work can be as small
as a decode step's budget asks, even inside one long input.

An embedding is the last layer's hidden states pooled over the input
(mean, or the last token's), L2-normalized. A score is the probability
the model gives "yes" over "yes" + "no" as the first token of its answer
to a judgement prompt (`stages/engine/work_service.py` writes it), read off the last
prompt position only, so the head never runs over the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs
import numpy as np

from pipeline.errors import invalid
from stages.models.mlx_internals import final_hidden, head_logits

Pooling = Literal["mean", "last"]
# Rows in one forward pass, whatever their length.
_MAX_ROWS = 64
# Padded tokens in one group: bounds its cache and a forward pass's memory.
_MAX_TOKENS = 8192


@attrs.define
class SideModel:
    """A model served beside the chat model (a dedicated embedding model): loaded on the model thread, once.

    Model thread only: `get` loads it the first time (`LoadWork` does so at
    start-up, queued before the first request).
    """

    _load: Callable[[], Any] = attrs.field(alias="load")
    _model: Any = attrs.field(default=None, init=False)

    def get(self) -> Any:
        if self._model is None:
            self._model = self._load()
        return self._model


@attrs.define
class LoadWork:
    """Loads a side model between steps; it counts no units, so it leaves the queue's speed estimate alone."""

    side: SideModel
    _done: bool = attrs.field(default=False, init=False)

    def remaining(self) -> int:
        return 0 if self._done else 1

    def run_chunk(self, model: Any, max_units: int) -> int:
        self.side.get()
        self._done = True
        return 0

    def result(self) -> None:
        return None


@attrs.define
class _Group:
    """Inputs padded into one batch, run a slice of columns at a time over one cache."""

    indices: list[int]
    batch: Any
    lengths: Any
    cache: list[Any]
    column: int = 0
    # Per row: the hidden states summed over its real tokens, and its last token's.
    sums: Any = None
    last: Any = None

    @property
    def width(self) -> int:
        return int(self.batch.shape[1])

    def step(self, model: Any, columns: int) -> int:
        """Run the next `columns` columns; the padded tokens run."""
        import mlx.core as mx

        end = min(self.width, self.column + columns)
        hidden = final_hidden(model, self.batch[:, self.column : end], self.cache)
        if hidden is None:
            raise invalid("This model's architecture does not expose hidden states", param="model")
        hidden = hidden.astype(mx.float32)
        positions = mx.arange(self.column, end)[None, :]
        real = (positions < self.lengths[:, None]).astype(mx.float32)[..., None]
        chunk_sum = (hidden * real).sum(axis=1)
        is_last = (positions == self.lengths[:, None] - 1).astype(mx.float32)[..., None]
        chunk_last = (hidden * is_last).sum(axis=1)
        self.sums = chunk_sum if self.sums is None else self.sums + chunk_sum
        self.last = chunk_last if self.last is None else self.last + chunk_last
        mx.eval(self.sums, self.last)
        ran = (end - self.column) * len(self.indices)
        self.column = end
        return ran


@attrs.define
class _Groups:
    """Inputs in length order, grouped and run a slice at a time."""

    inputs: Sequence[Sequence[int]]
    order: list[int] = attrs.field(init=False)
    next: int = 0
    current: _Group | None = None
    left: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.order = sorted(range(len(self.inputs)), key=lambda i: len(self.inputs[i]))
        self.left = sum(len(tokens) for tokens in self.inputs)

    def run(self, model: Any, max_units: int) -> tuple[int, _Group | None]:
        """Run about `max_units` padded tokens (one column of the group at least); the group, once it is done."""
        group = self.current = self.current or self._open(model)
        columns = max(1, max_units // len(group.indices))
        before = group.column
        ran = group.step(model, columns)
        # `left` counts real tokens; a group's columns past its shortest input include padding.
        self.left -= sum(min(int(n), group.column) - min(int(n), before) for n in self._lengths(group))
        if group.column < group.width:
            return ran, None
        self.current = None
        return ran, group

    def _lengths(self, group: _Group) -> list[int]:
        return [len(self.inputs[i]) for i in group.indices]

    def _open(self, model: Any) -> _Group:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        chosen = [self.order[self.next]]
        while self.next + len(chosen) < len(self.order) and len(chosen) < _MAX_ROWS:
            candidate = self.order[self.next + len(chosen)]
            # Sorted ascending: the candidate is the longest, so it sets the padded width.
            if len(self.inputs[candidate]) * (len(chosen) + 1) > _MAX_TOKENS:
                break
            chosen.append(candidate)
        self.next += len(chosen)
        rows = [self.inputs[i] for i in chosen]
        batch = np.zeros((len(rows), max(len(row) for row in rows)), dtype=np.int32)
        for i, row in enumerate(rows):
            batch[i, : len(row)] = row
        lengths = mx.array([len(row) for row in rows])
        return _Group(indices=chosen, batch=mx.array(batch), lengths=lengths, cache=make_prompt_cache(model))


@attrs.define
class EmbedWork:
    """Vectors for token inputs: `remaining` counts tokens still to run."""

    inputs: Sequence[Sequence[int]]
    pooling: Pooling
    # The first `dimensions` of each vector, normalized again (Matryoshka); None: all of them.
    dimensions: int | None = None
    # The model to run instead of the one the gateway passes (the chat model).
    side: SideModel | None = None
    _groups: _Groups = attrs.field(init=False)
    _vectors: list[np.ndarray[Any, Any] | None] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._groups = _Groups(self.inputs)
        self._vectors = [None] * len(self.inputs)

    def remaining(self) -> int:
        return self._groups.left

    def run_chunk(self, model: Any, max_units: int) -> int:
        import mlx.core as mx

        ran, group = self._groups.run(model if self.side is None else self.side.get(), max_units)
        if group is not None:
            pooled = group.sums / group.lengths[:, None].astype(mx.float32) if self.pooling == "mean" else group.last
            pooled = pooled if self.dimensions is None else pooled[:, : self.dimensions]
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
            result = np.array(pooled)
            for row, index in enumerate(group.indices):
                self._vectors[index] = result[row]
        return ran

    def result(self) -> list[np.ndarray[Any, Any]]:
        assert all(vector is not None for vector in self._vectors)
        return [vector for vector in self._vectors if vector is not None]


@attrs.define
class ScoreWork:
    """P(yes) / (P(yes) + P(no)) for each judgement prompt."""

    inputs: Sequence[Sequence[int]]
    yes: int
    no: int
    side: SideModel | None = None
    _groups: _Groups = attrs.field(init=False)
    _scores: list[float] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._groups = _Groups(self.inputs)
        self._scores = [0.0] * len(self.inputs)

    def remaining(self) -> int:
        return self._groups.left

    def run_chunk(self, model: Any, max_units: int) -> int:
        import mlx.core as mx

        model = model if self.side is None else self.side.get()
        ran, group = self._groups.run(model, max_units)
        if group is not None:
            logits = head_logits(model, group.last)
            if logits is None:
                raise invalid("This model's output head cannot be read for scoring", param="model")
            pair = logits.astype(mx.float32)[:, mx.array([self.yes, self.no])]
            probabilities = np.array(mx.softmax(pair, axis=-1))
            for row, index in enumerate(group.indices):
                self._scores[index] = float(probabilities[row, 0])
        return ran

    def result(self) -> list[float]:
        return list(self._scores)
