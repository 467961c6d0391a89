"""A quantized KV cache that the continuous batch can hold.

mlx-lm 0.32.2 has `QuantizedKVCache` (one sequence: keys and values as
`mx.quantize` triples, packed values, scales and biases) and quantizes
`generate_step`'s cache with `kv_bits`, but its `BatchGenerator` merges
rows only through a layer's `merge`, which `QuantizedKVCache` lacks, and
its `BatchKVCache` holds full-precision arrays only. So this module adds:

- `RowQuantizedKV`: mlx-lm's `QuantizedKVCache` with the `merge` that
  turns rows into a batch layer (what the prompt cache keeps, what a
  preempted row leaves, what the batch hands back);
- `BatchQuantizedKV`: `BatchKVCache`'s layout (left padding, per-row
  offsets, filter, extend, extract, right-padded prefill) over the three
  arrays of each quantized tensor. It carries `bits` and `group_size`, so
  mlx-lm's attention takes its quantized path (`quantized_matmul`);
- `QuantizedBatchGenerator`: a `BatchGenerator` whose rows without a
  cache start with quantized layers, so every row is quantized from its
  first token and one batch never mixes schemes.

Only plain `KVCache` layers are quantized; a model with sliding-window or
recurrent layers is refused at start (`refusal`), as is a head dim the
group size does not divide. Model thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import KVCache, QuantizedKVCache, _BaseCache

from stages.kv.shape import KvScheme

# Helpers mlx-lm's cache module uses without exporting them (untyped there).
_untyped: Any = mlx_cache
create_causal_mask, dynamic_roll = _untyped.create_causal_mask, _untyped.dynamic_roll

Triple = tuple[mx.array, mx.array, mx.array]


class RowQuantizedKV(QuantizedKVCache):
    """One row's quantized layer, as mlx-lm's QuantizedKVCache holds it, that the batch can merge."""

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> BatchQuantizedKV:
        return BatchQuantizedKV.merge(caches)

    def size(self) -> int:
        return int(self.offset)

    @property
    def nbytes(self) -> int:
        # mlx-lm's QuantizedKVCache.nbytes fails on an empty cache (a row still waiting to prefill).
        if self.keys is None or self.values is None:
            return 0
        return sum(part.nbytes for part in (*self.keys, *self.values))


def _zeros(batch: int, heads: int, length: int, head_dim: int, dtype: Any, scheme: KvScheme) -> Triple:
    assert scheme.bits is not None
    packed = head_dim * scheme.bits // 32
    groups = head_dim // scheme.group_size
    return (
        mx.zeros((batch, heads, length, packed), dtype=mx.uint32),
        mx.zeros((batch, heads, length, groups), dtype=dtype),
        mx.zeros((batch, heads, length, groups), dtype=dtype),
    )


def _map(function: Any, triple: Triple) -> Triple:
    first, second, third = (function(part) for part in triple)
    return first, second, third


class BatchQuantizedKV(_BaseCache):
    """mlx-lm's BatchKVCache, holding each of keys and values as a quantized triple."""

    step = 256

    def __init__(self, left_padding: Sequence[int], *, bits: int, group_size: int) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.left_padding = mx.array(list(left_padding))
        self.offset = mx.array([-pad for pad in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None
        # Read by mlx-lm's scaled_dot_product_attention to choose the quantized kernels.
        self.bits, self.group_size = bits, group_size

    @property
    def scheme(self) -> KvScheme:
        return KvScheme(bits=self.bits, group_size=self.group_size)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        prev, steps = self._idx, keys.shape[2]
        if self.keys is None or self.values is None or prev + steps > self.keys[0].shape[2]:
            batch, heads, _, key_dim = keys.shape
            length = (self.step + steps - 1) // self.step * self.step
            new_keys = _zeros(batch, heads, length, key_dim, keys.dtype, self.scheme)
            new_values = _zeros(batch, heads, length, values.shape[3], values.dtype, self.scheme)
            if self.keys is not None and self.values is not None:
                self.keys = tuple(
                    mx.concatenate([old[..., :prev, :], new], axis=2) for old, new in zip(self.keys, new_keys)
                )  # type: ignore[assignment]
                self.values = tuple(
                    mx.concatenate([old[..., :prev, :], new], axis=2) for old, new in zip(self.values, new_values)
                )  # type: ignore[assignment]
            else:
                self.keys, self.values = new_keys, new_values
        assert self.keys is not None and self.values is not None
        self.offset = self.offset + steps
        self._idx += steps
        quantized_keys = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        quantized_values = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for held, new in zip((*self.keys, *self.values), (*quantized_keys, *quantized_values)):
            held[..., prev : self._idx, :] = new
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Triple, Triple]:
        assert self.keys is not None and self.values is not None
        return _map(lambda part: part[..., : self._idx, :], self.keys), _map(
            lambda part: part[..., : self._idx, :], self.values
        )

    def prepare(
        self,
        *,
        left_padding: Sequence[int] | None = None,
        lengths: Any = None,
        right_padding: Sequence[int] | None = None,
    ) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty BatchQuantizedKV")
            added = mx.array(list(left_padding))
            self.left_padding = self.left_padding + added
            self.offset = self.offset - added
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(list(right_padding))

    def finalize(self) -> None:
        if self._right_padding is None or self.keys is None or self.values is None:
            return
        padding = self._right_padding
        self.keys = _map(lambda part: dynamic_roll(part, padding[:, None], axis=2), self.keys)
        self.values = _map(lambda part: dynamic_roll(part, padding[:, None], axis=2), self.values)
        self.offset = self.offset - padding
        self.left_padding = self.left_padding + padding
        self._right_padding = None

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, value: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = value

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    def filter(self, batch_indices: Any) -> None:
        if self.keys is not None and self.values is not None:
            self.keys = _map(lambda part: part[batch_indices], self.keys)
            self.values = _map(lambda part: part[batch_indices], self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        # Shift left to drop the padding every remaining row shares.
        shared = min(cast(list[int], self.left_padding.tolist()))
        if shared > 0:
            if self.keys is not None and self.values is not None:
                self.keys = _map(lambda part: part[..., shared:, :], self.keys)
                self.values = _map(lambda part: part[..., shared:, :], self.values)
            self._idx -= shared
            self.left_padding = self.left_padding - shared

    def extend(self, other: BatchQuantizedKV) -> None:
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        held = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        template = next(c for c in (self, other) if c.keys is not None)
        assert template.keys is not None and template.values is not None
        template_keys, template_values = template.keys, template.values

        def padded(cache: BatchQuantizedKV) -> tuple[Triple, Triple, mx.array, mx.array]:
            keys, values = cache.keys, cache.values
            if keys is None or values is None:
                rows = cache.offset.shape[0]
                keys = _map(
                    lambda part: mx.zeros((rows, part.shape[1], 0, part.shape[3]), dtype=part.dtype), template_keys
                )
                values = _map(
                    lambda part: mx.zeros((rows, part.shape[1], 0, part.shape[3]), dtype=part.dtype), template_values
                )
            left = held - cache._idx
            right = size - keys[0].shape[2] - left
            if right < 0:
                keys, values = (
                    _map(lambda part: part[..., :right, :], keys),
                    _map(lambda part: part[..., :right, :], values),
                )
                right = 0
            if left or right:
                widths = [(0, 0), (0, 0), (left, right), (0, 0)]
                keys, values = (
                    _map(lambda part: mx.pad(part, widths), keys),
                    _map(lambda part: mx.pad(part, widths), values),
                )
            return keys, values, cache.offset, cache.left_padding + left

        (mine_k, mine_v, mine_o, mine_l), (their_k, their_v, their_o, their_l) = padded(self), padded(other)
        self.keys = _map_pair(mine_k, their_k)
        self.values = _map_pair(mine_v, their_v)
        self.offset = mx.concatenate([mine_o, their_o])
        self.left_padding = mx.concatenate([mine_l, their_l])
        self._idx = held

    def extract(self, idx: int) -> RowQuantizedKV:
        row: Any = RowQuantizedKV(group_size=self.group_size, bits=self.bits)
        assert self.keys is not None and self.values is not None
        padding = cast(list[int], self.left_padding.tolist())[idx]
        row.keys = _map(lambda part: mx.contiguous(part[idx : idx + 1, :, padding : self._idx]), self.keys)
        row.values = _map(lambda part: mx.contiguous(part[idx : idx + 1, :, padding : self._idx]), self.values)
        row.offset = self._idx - padding
        return cast(RowQuantizedKV, row)

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> BatchQuantizedKV:
        first = caches[0]
        lengths = [int(c.offset) if c.keys is not None else 0 for c in caches]
        longest = max(lengths)
        if longest == 0:
            return cls([0] * len(caches), bits=first.bits, group_size=first.group_size)
        padding = [longest - length for length in lengths]
        template = next(c for c in caches if c.keys is not None)
        keys = _map(
            lambda part: mx.zeros((len(caches), part.shape[1], longest, part.shape[3]), dtype=part.dtype), template.keys
        )
        values = _map(
            lambda part: mx.zeros((len(caches), part.shape[1], longest, part.shape[3]), dtype=part.dtype),
            template.values,
        )
        for index, (pad, cache) in enumerate(zip(padding, caches)):
            if cache.keys is None:
                continue
            for held, given in zip((*keys, *values), (*cache.keys, *cache.values)):
                held[index : index + 1, :, pad : pad + cache.offset] = given[..., : cache.offset, :]
        batch = cls(padding, bits=first.bits, group_size=first.group_size)
        batch.keys, batch.values = keys, values
        batch.offset = batch.offset + longest
        batch._idx = longest
        return batch

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(part.nbytes for part in (*self.keys, *self.values))


def _map_pair(mine: Triple, theirs: Triple) -> Triple:
    first, second, third = (mx.concatenate([a, b]) for a, b in zip(mine, theirs))
    return first, second, third


def row_cache(model: Any, scheme: KvScheme) -> list[Any]:
    """A fresh row's layers: quantized where mlx-lm would make a plain KVCache (a `refusal` leaves no others)."""
    from mlx_lm.models.cache import make_prompt_cache

    assert scheme.bits is not None
    return [
        RowQuantizedKV(group_size=scheme.group_size, bits=scheme.bits) if type(layer) is KVCache else layer
        for layer in make_prompt_cache(model)
    ]


def refusal(model: Any, scheme: KvScheme) -> str | None:
    """Why `scheme` cannot serve `model` (named exactly), or None when it can."""
    from mlx_lm.models.cache import make_prompt_cache

    others = sorted({type(layer).__name__ for layer in make_prompt_cache(model) if type(layer) is not KVCache})
    if others:
        return (
            f"MLX_RELAY_KV_BITS={scheme.bits} cannot serve this model: its cache has {', '.join(others)} layers "
            "(sliding-window or recurrent), which mlx-lm cannot quantize; only plain KVCache layers can be"
        )
    # One token through quantized layers: a head dim the group size does not divide, or attention
    # that mlx-lm's quantized kernels cannot run (sinks), fails here rather than in a request.
    try:
        mx.eval(model(mx.array([[0]]), cache=row_cache(model, scheme)))
    except ValueError as error:
        return (
            f"MLX_RELAY_KV_BITS={scheme.bits} with MLX_RELAY_KV_GROUP_SIZE={scheme.group_size} "
            f"cannot serve this model: {error}"
        )
    return None


class QuantizedBatchGenerator(BatchGenerator):
    """mlx-lm's BatchGenerator whose rows, given no cache, start with quantized layers."""

    def __init__(self, model: Any, *, kv_scheme: KvScheme, **options: Any) -> None:
        super().__init__(model, **options)
        self._kv_scheme = kv_scheme

    def insert_segments(self, segments: Any, max_tokens: Any = None, caches: Any = None, *rest: Any) -> Any:
        given = caches or [None] * len(segments)
        filled = [cache if cache is not None else row_cache(self.model, self._kv_scheme) for cache in given]
        return super().insert_segments(segments, max_tokens, filled, *rest)


def batch_generator(base: type, scheme: KvScheme) -> Any:
    """What builds the batch for `scheme`: mlx-lm's `base` as is, or one that starts every row quantized."""
    if not scheme.quantized:
        return base
    return partial(QuantizedBatchGenerator, kv_scheme=scheme)
