"""Rank 0's side of a sharded batch: the generator and prompt cache that every rank replays.

`ReplicatedGenerator` is mlx-lm's `BatchGenerator` as the gateway uses it
(insert, remove, extract_cache, next, close), recording each call; at
`next` it sends the calls since the last step to every other rank in one
message (`transport.Broadcast`), then steps. The prompt cache, its disk
tier (`stages/shard/caches.py`) and exclusive model work
(`stages/shard/work.py`) record into the same log: each rank keeps its own
slice of every entry, and rank 0 decides. A disk read or a forward pass
outside the generator sends the log at once, ending with that operation,
so the other ranks reach it in the same order.

Cache objects cross as handles: both sides number the cache lists the
generator hands out (removed rows, finished rows, checkpoints) and the
cache's hits in the same order, and forget the numbers at each step.

Sampling: a row whose token does not follow from the logits alone (a
seeded or temperature sampler, penalties, bias, a grammar, a thinking
budget) samples on rank 0 only, and its sampler ends with an `all_sum` in
which the other ranks add zero: every rank feeds rank 0's token to the
next step, inside the step's own graph. That is simpler than running the
samplers, seeds, grammar matchers and their rewinds on every rank, and it
cannot drift. A greedy row with no processors samples on every rank: the
logits are the same on every rank (the last all_sum hands each rank the
same sum), and the step check below would say so if they were not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import greedy_sampler

from stages.shard.transport import Broadcast


class Desync(RuntimeError):
    """A rank's replay no longer matches rank 0: the engine stops."""


@attrs.define
class Handles:
    """Cache lists by number, both sides numbering them in the same order."""

    _next: int = 0
    _by_id: dict[int, int] = attrs.field(factory=dict)
    _objects: dict[int, Any] = attrs.field(factory=dict)

    def add(self, cache: Any) -> int:
        number = self._next
        self._next += 1
        self._by_id[id(cache)] = number
        self._objects[number] = cache
        return number

    def number(self, cache: Any) -> int:
        if id(cache) not in self._by_id:
            raise Desync("a cache the other ranks do not hold")
        return self._by_id[id(cache)]

    def get(self, number: int) -> Any:
        if number not in self._objects:
            raise Desync(f"no cache numbered {number} on this rank")
        return self._objects[number]

    def forget(self) -> None:
        self._by_id.clear()
        self._objects.clear()


@attrs.define
class StepLog:
    """The calls since the last step, and the tokens it produced (the followers check theirs)."""

    ops: list[dict[str, Any]] = attrs.field(factory=list)
    handles: Handles = attrs.field(factory=Handles)
    check: list[list[int]] = attrs.field(factory=list)
    # Rank 0's disk tier is on: the followers open theirs (told in the first message).
    disk: bool = False
    channel: Broadcast | None = None
    # Wakes the followers before each message (`transport.Broadcast`); None rings nothing.
    doorbell: Callable[[], None] | None = None

    def send(self, last: dict[str, Any]) -> None:
        """The calls so far and `last`, in one message to every other rank."""
        assert self.channel is not None, "the generator opens the channel"
        self.channel.send({"ops": [*self.ops, last], "check": self.check})
        self.ops.clear()


def register_removed(handles: Handles, caches: dict[int, Any]) -> None:
    for uid in sorted(caches):
        handles.add(caches[uid][0])


def register_finished(handles: Handles, generated: Sequence[Any]) -> list[list[int]]:
    """Number the finished rows' caches; the step's (uid, token) pairs."""
    for response in generated:
        if response.finish_reason is not None and response.prompt_cache is not None:
            handles.add(response.prompt_cache)
    return [[response.uid, response.token] for response in generated]


def is_local(sampler: object, processors: Sequence[object] | None) -> bool:
    """The row's token follows from the logits alone, so every rank can sample it."""
    return sampler is greedy_sampler and not processors


class RankZeroSampler:
    """Rank 0's sampler, its token summed with the other ranks' zeros: every rank gets it."""

    def __init__(self, inner: Callable[[mx.array], mx.array], group: mx.distributed.Group) -> None:
        self._inner, self._group = inner, group

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.distributed.all_sum(self._inner(logprobs), group=self._group)


class ReplicatedGenerator:
    """mlx-lm's `BatchGenerator` on rank 0, every call replayed by the other ranks."""

    def __init__(self, model: Any, group: mx.distributed.Group, log: StepLog, **config: Any) -> None:
        self._generator = BatchGenerator(model, **config)
        self._group, self._log = group, log
        self.channel = log.channel = Broadcast(group, self._generator.stream, doorbell=log.doorbell)
        self.channel.send({"config": config, "disk": log.disk})
        self.steps = 0

    def __getattr__(self, name: str) -> Any:
        # Reads (prompt_cache_nbytes, stream) are the local generator's: every rank holds its own slice.
        return getattr(self._generator, name)

    def insert(
        self,
        prompts: list[list[int]],
        *,
        max_tokens: list[int],
        caches: list[Any] | None,
        all_tokens: list[list[int]],
        samplers: list[Any],
        logits_processors: list[Any],
        stop_sequences: list[Any] | None = None,
    ) -> list[int]:
        local = [is_local(s, p) for s, p in zip(samplers, logits_processors)]
        wrapped = [s if keep else RankZeroSampler(s, self._group) for s, keep in zip(samplers, local)]
        handles = [None if c is None else self._log.handles.number(c) for c in (caches or [None] * len(prompts))]
        uids: list[int] = self._generator.insert(
            prompts,
            max_tokens=max_tokens,
            caches=caches,
            all_tokens=all_tokens,
            samplers=wrapped,
            logits_processors=logits_processors,
            stop_sequences=stop_sequences,
        )
        # Each row's own stops (EOS, stop_token_ids, ignore_eos) end it on every rank at the same step.
        stops = None if stop_sequences is None else [stop.sequences for stop in stop_sequences]
        self._log.ops.append(
            {
                "op": "insert",
                "prompts": prompts,
                "max_tokens": max_tokens,
                "caches": handles,
                "all_tokens": all_tokens,
                "local": local,
                "uids": uids,
                "stops": stops,
            }
        )
        return uids

    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> dict[int, Any]:
        self._log.ops.append({"op": "remove", "uids": list(uids), "caches": return_prompt_caches})
        caches: dict[int, Any] = self._generator.remove(uids, return_prompt_caches=return_prompt_caches)
        register_removed(self._log.handles, caches)
        return caches

    def extract_cache(self, uids: list[int]) -> dict[int, Any]:
        self._log.ops.append({"op": "extract", "uids": list(uids)})
        caches: dict[int, Any] = self._generator.extract_cache(uids)
        register_removed(self._log.handles, caches)
        return caches

    def next(self) -> tuple[Any, Any]:
        log = self._log
        log.send({"op": "next"})
        log.handles.forget()
        self.steps += 1
        prefilled, generated = self._generator.next()
        log.check = register_finished(log.handles, generated)
        return prefilled, generated

    def close(self) -> None:
        try:
            self._log.send({"op": "close"})
        finally:
            self._generator.close()
