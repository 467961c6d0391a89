"""A follower rank's model loop: no HTTP, only rank 0's steps, replayed exactly.

Each message holds the generator calls rank 0 made since its last step
(`stages/shard/replicated.py`), ending with `next` or `close`. The
follower makes the same calls on its own `BatchGenerator` and prompt
cache, in the same order, so its uids and cache handles are the same as
rank 0's; the message also carries the tokens rank 0's last step
produced, which must be this rank's too. Anything that does not match is
a `Desync`: the follower stops, its sockets close, and rank 0's next
collective fails, which stops the engine there.

Two operations come between steps, each ending a message of its own: a
disk restore, which every rank votes on (`stages/shard/caches.py`), and a
chunk of exclusive model work (embeddings, scores), whose forward pass
every rank runs (`stages/shard/work.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import structlog
from mlx_lm.generate import BatchGenerator, StopSequences, generation_stream
from mlx_lm.sample_utils import greedy_sampler

from stages.cache.disk import DiskTier
from stages.cache.link import DiskLink
from stages.cache.prompt import PromptCache
from stages.cache.tier import Entry
from stages.models.mlx_internals import restore_layer
from stages.shard.caches import FollowerDisk, disk_op, refuse
from stages.shard.replicated import Desync, Handles, register_finished, register_removed
from stages.shard.transport import Broadcast
from stages.shard.work import WorkReplay

log = structlog.get_logger(stage="follower")

# Rank 0 decides what the cache keeps and evicts; a follower's own bound never applies.
_UNBOUNDED = 2**62


class FollowerSampler:
    """Adds nothing to rank 0's token in the sum every rank takes (`RankZeroSampler`).

    The zeros are computed from the logits so that this collective runs
    after the step's forward pass, as rank 0's does.
    """

    def __init__(self, group: mx.distributed.Group) -> None:
        self._group = group

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.distributed.all_sum(mx.argmax(logprobs, axis=-1) * 0, group=self._group)


class Follower:
    def __init__(
        self,
        model: Any,
        group: mx.distributed.Group,
        on_step: Callable[[int], None] = lambda steps: None,
        open_disk: Callable[[], DiskTier | None] = lambda: None,
        doorbell: Callable[[], None] | None = None,
    ) -> None:
        self._model, self._group, self._on_step, self._open_disk = model, group, on_step, open_disk
        self._handles = Handles()
        self._cache = PromptCache(max_bytes=_UNBOUNDED)
        self._disk: FollowerDisk | None = None
        # Waiting for rank 0's ring, not in the collective, is what lets an idle follower sleep.
        self._channel = Broadcast(group, generation_stream, doorbell=doorbell)
        self._work = WorkReplay()
        self._check: list[list[int]] = []
        self.steps = 0

    def run(self) -> None:
        first = self._channel.receive()
        config = first["config"]
        generator = BatchGenerator(self._model, **config)
        if first.get("disk"):
            self._attach_disk()
        log.info("follower.ready", rank=self._group.rank(), config=config, disk=self._disk is not None)
        try:
            while self._replay(generator, self._channel.receive()):
                pass
        finally:
            if self._disk is not None:
                self._disk.close()
            generator.close()
            del generator
            mx.clear_cache()

    def _attach_disk(self) -> None:
        disk = self._open_disk()
        if disk is None:
            # It votes no to every restore: rank 0's files then go unused, and its answers stay right.
            log.warning("follower.no_disk_tier", rank=self._group.rank())
            return
        disk.scan()
        self._disk = FollowerDisk(DiskLink(disk, [], restore_layer))
        self._cache.attach(self._disk)

    def _replay(self, generator: BatchGenerator, message: dict[str, Any]) -> bool:
        if message["check"] != self._check:
            raise Desync(f"step {self.steps}: rank 0 made {message['check']}, this rank {self._check}")
        for op in message["ops"]:
            kind = op["op"]
            if kind == "close":
                log.info("follower.stop", rank=self._group.rank(), steps=self.steps)
                return False
            if kind == "next":
                self._handles.forget()
                _, generated = generator.next()
                self._check = register_finished(self._handles, generated)
                self.steps += 1
                self._on_step(self.steps)
            else:
                self._apply(generator, kind, op)
        return True

    def _apply(self, generator: BatchGenerator, kind: str, op: dict[str, Any]) -> None:
        handles = self._handles
        if kind == "insert":
            caches: list[Any] | None = [None if h is None else handles.get(h) for h in op["caches"]]
            uids = generator.insert(
                op["prompts"],
                max_tokens=op["max_tokens"],
                caches=None if caches is None or all(c is None for c in caches) else caches,
                all_tokens=op["all_tokens"],
                samplers=[greedy_sampler if local else FollowerSampler(self._group) for local in op["local"]],
                logits_processors=[[] for _ in op["local"]],
                stop_sequences=None if op.get("stops") is None else [StopSequences(stops) for stops in op["stops"]],
            )
            if uids != op["uids"]:
                raise Desync(f"rank 0 inserted {op['uids']}, this rank {uids}")
        elif kind == "remove":
            register_removed(handles, generator.remove(op["uids"], return_prompt_caches=op["caches"]))
        elif kind == "extract":
            register_removed(handles, generator.extract_cache(op["uids"]))
        elif kind == "fetch":
            self._fetch(op)
        elif kind == "store":
            self._store(op)
        elif kind == "restore":
            self._disk.vote(tuple(op["key"]), self._channel) if self._disk is not None else refuse(self._channel)
        elif kind == "work":
            self._work.run(self._model, op, generation_stream)
        else:
            raise Desync(f"unknown step operation {kind!r}")

    def _fetch(self, op: dict[str, Any]) -> None:
        if self._disk is not None:
            self._disk.decision = disk_op(op)
        hit = self._cache.fetch(op["tokens"], session=op["session"])
        if (hit and hit.tokens) != op["tokens_hit"]:
            raise Desync(f"rank 0's cache held {op['tokens_hit']} tokens of a prompt, this rank's {hit and hit.tokens}")
        if hit is not None:
            self._handles.add(hit.cache)
        self._forget(op)

    def _forget(self, op: dict[str, Any]) -> None:
        spilled = {tuple(key) for key in op["spilled"]}
        for key in map(tuple, op["gone"]):
            self._cache.drop(key, spill=key in spilled)

    def _store(self, op: dict[str, Any]) -> None:
        cache = self._handles.get(op["handle"])
        if cache:
            # As on rank 0: evaluated, the entry stops referring to the batch's arrays.
            mx.eval([layer.state for layer in cache])
        entry = Entry(tokens=tuple(op["tokens"]), cache=cache, prompt_len=op["prompt_len"], session=op["session"])
        replaces = op["replaces"]
        self._cache.store(entry, replaces=None if replaces is None else tuple(replaces))
        self._forget(op)
