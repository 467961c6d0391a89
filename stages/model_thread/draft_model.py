"""A draft model's proposals for every proposing row at once: one forward pass of the draft model a position.

The draft model keeps the proposing rows in a batch cache of its own
(mlx-lm's `BatchKVCache`, left-padded as the target's batch is), each row
following the target's row by its longest common prefix with the row's
history. A step that drafts for several rows:

1. rows the draft batch holds that do not propose now leave it with their
   own cache (parked); rows that propose and are not in it catch up alone
   on their parked cache (or a new one: the draft's prefill of the row's
   history) and join it;
2. each row's rejected positions leave its KV: the row is rolled right by
   their number, so they become left padding (the target's batch cuts
   its own this way, stages/model_thread/speculative_batch.py);
3. the tokens each row gained since (its accepted ones, its pending one)
   go through ONE forward pass, right-padded to the longest, and the
   padding is rolled off again;
4. `k` greedy positions follow, one forward pass each for all the rows;
   they are read once, at the end.

A single row (the row alone on the single-row path, or the only one
proposing) drafts on its own `KVCache`, without the batch's masks.

The draft model's prefill of a new row's history costs what the target's
does, and the target's prompt cache does not hold the draft's KV; so the
caches of the last few rows that left are kept, and a new row starts
from the one sharing the longest prefix with its history (a repeated
prompt, the next turn of a conversation).
Only plain `KVCache` layers: a draft model with others is refused at
start (stages/engine/speculation.py). Model thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import attrs

from stages.models.mlx_internals import kv_layer, plain_kv

# Caches of rows that left, kept for new rows that start the same way.
_KEPT = 4


@attrs.define
class _Parked:
    """A row outside the draft batch: its own cache and the tokens it holds."""

    cache: list[Any]
    fed: list[int] = attrs.Factory(list)


@attrs.define
class DraftModel:
    """A second model's greedy continuation for each proposing row, drafted together; see the module's text."""

    model: Any
    name: str = "draft_model"
    # The draft batch: its rows in order, the tokens it holds for each, and its layers (None: empty).
    _uids: list[int] = attrs.field(factory=list, init=False)
    _fed: list[list[int]] = attrs.field(factory=list, init=False)
    _cache: list[Any] | None = attrs.field(default=None, init=False)
    _parked: dict[int, _Parked] = attrs.field(factory=dict, init=False)
    # Rows that left, the latest last.
    _kept: list[_Parked] = attrs.field(factory=list, init=False)
    # Forward passes of the draft model that drafted for more than one row (the batched ones).
    batched_passes: int = attrs.field(default=0, init=False)
    # History tokens the last call fed (a new row's prompt, the tokens a row gained while it did not propose).
    caught_up: int = attrs.field(default=0, init=False)

    def propose(self, uid: int, history: Sequence[int], k: int) -> list[int]:
        return self.propose_many([(uid, history, k)])[0]

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        """Up to `k` tokens to follow each `(uid, history, k)` (history: every token so far, the pending one last)."""
        wanted = [uid for uid, _, _ in requests]
        self.caught_up = 0
        self._park([uid for uid in self._uids if uid not in wanted])
        if len(requests) == 1:
            uid, history, k = requests[0]
            self._park([uid])
            return [self._alone(uid, history, k)]
        for uid, history, _ in requests:
            if uid not in self._uids:
                self._join(uid, history)
        by_uid = {uid: (history, k) for uid, history, k in requests}
        proposals = self._drafted([by_uid[uid][0] for uid in self._uids], max(k for _, _, k in requests))
        drafted = dict(zip(self._uids, proposals))
        return [drafted[uid][:k] for uid, _, k in requests]

    def forget(self, uids: Sequence[int]) -> None:
        self._park(uids)
        for uid in uids:
            row = self._parked.pop(uid, None)
            if row is not None and row.fed:
                self._kept = [*self._kept, row][-_KEPT:]

    # -- one row ---------------------------------------------------------------

    def _alone(self, uid: int, history: Sequence[int], k: int) -> list[int]:
        import mlx.core as mx

        row = self._synced(uid, history)
        self.caught_up += len(history) - len(row.fed)
        logits = self.model(mx.array(list(history[len(row.fed) :]))[None], cache=row.cache)[:, -1, :]
        row.fed.extend(history[len(row.fed) :])
        tokens = [mx.argmax(logits, axis=-1)]
        for _ in range(k - 1):
            logits = self.model(tokens[-1][None], cache=row.cache)[:, -1, :]
            tokens.append(mx.argmax(logits, axis=-1))
        proposed = cast(list[int], mx.concatenate(tokens).tolist())
        row.fed.extend(proposed[:-1])
        return proposed

    def _synced(self, uid: int, history: Sequence[int]) -> _Parked:
        """The row's own cache, holding the longest common prefix of what it held and `history`, short of its
        last token (whose logits start the proposal)."""
        from mlx_lm.models.cache import make_prompt_cache

        row = self._parked.get(uid)
        if row is None:
            row = self._parked[uid] = self._started(history) or _Parked(cache=make_prompt_cache(self.model))
        keep = min(_common_prefix(row.fed, history), len(history) - 1)
        if keep < len(row.fed):
            for layer in row.cache:
                layer.trim(len(row.fed) - keep)
            del row.fed[keep:]
        return row

    def _started(self, history: Sequence[int]) -> _Parked | None:
        """A new row's cache from the kept one sharing the longest prefix with `history`, cut to it, or None."""
        shared = [(min(_common_prefix(kept.fed, history), len(history) - 1), kept) for kept in self._kept]
        keep, best = max(shared, key=lambda pair: pair[0], default=(0, None))
        if best is None or keep <= 0:
            return None
        layers = []
        for layer in best.cache:
            keys, values = plain_kv(layer) or (None, None)
            if keys is None or values is None:
                return None
            # Slices: the kept arrays are never written through the new row's layers.
            layers.append(kv_layer(keys[..., :keep, :], values[..., :keep, :]))
        return _Parked(cache=layers, fed=best.fed[:keep])

    # -- the draft batch ---------------------------------------------------------

    def _park(self, uids: Sequence[int]) -> None:
        """Move `uids` out of the draft batch, each with its own cache."""
        leaving = [index for index, uid in enumerate(self._uids) if uid in set(uids)]
        if not leaving:
            return
        assert self._cache is not None  # rows in the batch
        for index in leaving:
            layers = [layer.extract(index) for layer in self._cache]
            self._parked[self._uids[index]] = _Parked(cache=layers, fed=self._fed[index])
        self._keep([index for index in range(len(self._uids)) if index not in set(leaving)])

    def _keep(self, indices: list[int]) -> None:
        if len(indices) == len(self._uids):
            return
        self._uids = [self._uids[index] for index in indices]
        self._fed = [self._fed[index] for index in indices]
        if not indices:
            self._cache = None
            return
        assert self._cache is not None  # rows in the batch
        for layer in self._cache:
            layer.filter(indices)

    def _join(self, uid: int, history: Sequence[int]) -> None:
        """The row into the draft batch, its cache caught up to all of `history` but its last token."""
        import mlx.core as mx
        from mlx_lm.models.cache import BatchKVCache

        row = self._synced(uid, history)
        missing = list(history[len(row.fed) : -1])
        if missing:
            self.caught_up += len(missing)
            self.model(mx.array(missing)[None], cache=row.cache)
            row.fed.extend(missing)
        merge: Any = BatchKVCache.merge  # untyped in mlx-lm
        joining = [merge([layer]) for layer in row.cache]
        if self._cache is None:
            self._cache = joining
        else:
            for layer, other in zip(self._cache, joining):
                layer.extend(other)
        del self._parked[uid]
        self._uids.append(uid)
        self._fed.append(row.fed)

    def _drafted(self, histories: list[Sequence[int]], k: int) -> list[list[int]]:
        """`k` greedy tokens for every row of the draft batch, its histories in its order."""
        import mlx.core as mx

        cache = self._cache
        assert cache is not None  # requests joined it
        kept = [min(_common_prefix(fed, history), len(history) - 1) for fed, history in zip(self._fed, histories)]
        _roll_off(cache, [len(fed) - keep for fed, keep in zip(self._fed, kept)])
        new = [list(history[keep:]) for history, keep in zip(histories, kept)]
        self.caught_up += sum(len(tokens) for tokens in new)
        width = max(len(tokens) for tokens in new)
        padded = [[*tokens, *[tokens[-1]] * (width - len(tokens))] for tokens in new]
        logits = self.model(mx.array(padded), cache=cache)
        last = logits[mx.arange(len(new)), mx.array([len(tokens) - 1 for tokens in new])]
        _roll_off(cache, [width - len(tokens) for tokens in new])
        tokens = [mx.argmax(last, axis=-1)]
        for _ in range(k - 1):
            logits = self.model(tokens[-1][:, None], cache=cache)[:, -1, :]
            tokens.append(mx.argmax(logits, axis=-1))
        self.batched_passes += k
        proposed = cast(list[list[int]], mx.stack(tokens, axis=1).tolist())
        for index, keep in enumerate(kept):
            self._fed[index] = [*self._fed[index][:keep], *new[index], *proposed[index][:-1]]
        return proposed


def _roll_off(cache: list[Any], counts: list[int]) -> None:
    """Drop each row's last `counts` positions from every layer: rolled right, they become its left padding."""
    if any(counts):
        for layer in cache:
            layer.prepare(right_padding=counts)
            layer.finalize()


def _common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    size = min(len(first), len(second))
    for index in range(size):
        if first[index] != second[index]:
            return index
    return size
