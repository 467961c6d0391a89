"""The prompt cache and its disk tier over the ranks: rank 0 decides, every rank holds its own slice.

Memory tier: `MirroredPromptCache` is rank 0's prompt cache, recording its
hits, stores and evictions into the step log; a follower makes the same
calls on its own cache, which never evicts by itself (its slice of an
entry is not rank 0's size).

Disk tier: every rank has its own folder (`stages/engine/decisions.py`), and writes
and reads its own files. Rank 0 decides which evicted entries go down (the
followers spill the same keys) and which file a prompt comes back from.
Writes are each rank's own, in the background, so one rank's file may be
missing (a write dropped, failed or evicted) or unreadable while rank 0's
is fine. So a restore is agreed before anyone uses it: rank 0 sends the
log at once, ending with `restore`; every rank reads and checks its own
file, and all of them vote (`Broadcast.agree`). All yes: every rank holds
the entry, and rank 0's fetch, which the followers then replay with the
same decision, serves from it. Any no: every rank deletes its copy and
the prompt prefills from memory's best on every rank, as on a miss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs
import structlog

from stages.cache.link import DiskLink
from stages.cache.prompt import Hit, PromptCache
from stages.cache.tier import DiskStatistics, Entry, Key, LowerTier
from stages.shard.replicated import StepLog
from stages.shard.transport import Broadcast

log = structlog.get_logger(stage="shard")

# Spills a follower has queued and not yet written; past this it drops them, as rank 0's writer does.
_PENDING_WRITES = 4


@attrs.define
class AgreedDisk:
    """Rank 0's disk tier: restores only what every rank can read; records what it spills and chose."""

    link: DiskLink
    step_log: StepLog
    # During one fetch: what the disk offered, and what rank 0 spilled (the followers spill the same).
    chosen: tuple[Key, int] | None = None
    spilled: list[Key] = attrs.field(factory=list)
    restored: Key | None = None

    # Sharded servers serve no adapters (refused at start): `adapter` is always None here.
    def longest(self, tokens: Sequence[int], adapter: str | None = None) -> tuple[Key, int] | None:
        self.chosen = self.link.longest(tokens, adapter)
        return self.chosen

    def restore(self, key: Key, adapter: str | None = None) -> Entry | None:
        started = time.perf_counter()
        self.step_log.send({"op": "restore", "key": list(key)})
        entry = self.link.load(key)
        assert self.step_log.channel is not None
        if not self.step_log.channel.agree(entry is not None):
            log.warning("shard.restore_refused", tokens=len(key), here=entry is not None)
            self.link.disk.discard(key)
            return None
        # Counted once the group uses it: the time includes the vote.
        self.link.count_restore(key, started)
        self.restored = key
        return entry

    def spill(self, entry: Entry) -> None:
        self.spilled.append(entry.tokens)
        self.link.spill(entry)

    def statistics(self) -> DiskStatistics:
        return self.link.statistics()


@attrs.define
class MirroredPromptCache(PromptCache):
    """The prompt cache on rank 0: its hits, stores and evictions go to the other ranks too."""

    step_log: StepLog = attrs.field(kw_only=True, factory=StepLog)
    _fetching: bool = attrs.field(default=False, init=False)

    def attach(self, lower: LowerTier) -> None:
        assert isinstance(lower, DiskLink)
        self.lower = AgreedDisk(lower, self.step_log)
        self.step_log.disk = True

    def fetch(self, tokens: Sequence[int], *, session: str | None = None, adapter: str | None = None) -> Hit | None:
        disk = self.lower if isinstance(self.lower, AgreedDisk) else None
        if disk is not None:
            disk.chosen = disk.restored = None
        before = self.keys()
        # A restored entry is stored inside the fetch: the followers' replay stores it too, so it is not recorded apart.
        self._fetching = True
        try:
            hit = super().fetch(tokens, session=session, adapter=adapter)
        finally:
            self._fetching = False
        chosen = disk.chosen if disk is not None else None
        if hit is None and chosen is None:
            return None
        if hit is not None:
            self.step_log.handles.add(hit.cache)
        if disk is not None and disk.restored is not None:
            before.add(disk.restored)
        self.step_log.ops.append(
            {
                "op": "fetch",
                "tokens": list(tokens),
                "session": session,
                "tokens_hit": hit and hit.tokens,
                "disk": chosen and [list(chosen[0]), chosen[1]],
                **self._gone(before),
            }
        )
        return hit

    def store(self, entry: Entry, *, replaces: Key | None = None) -> None:
        if self._fetching:
            super().store(entry, replaces=replaces)
            return
        before = self.keys() | {entry.tokens}
        super().store(entry, replaces=replaces)
        self.step_log.ops.append(
            {
                "op": "store",
                "handle": self.step_log.handles.number(entry.cache),
                "tokens": list(entry.tokens),
                "prompt_len": entry.prompt_len,
                "session": entry.session,
                "replaces": None if replaces is None else list(replaces),
                **self._gone(before),
            }
        )

    def _gone(self, before: set[Key]) -> dict[str, list[list[int]]]:
        """The entries no longer held, and which of them rank 0 spilled to disk."""
        disk = self.lower if isinstance(self.lower, AgreedDisk) else None
        spilled: list[Key] = disk.spilled if disk is not None else []
        record = {"gone": [list(key) for key in before - self.keys()], "spilled": [list(key) for key in spilled]}
        spilled.clear()
        return record


@attrs.define
class FollowerDisk:
    """A follower's disk tier: spills what rank 0 spilled, reads what rank 0 restores, and votes."""

    link: DiskLink
    # The disk's answer rank 0's fetch saw, for the fetch being replayed.
    decision: tuple[Key, int] | None = None
    _agreed: dict[Key, Entry] = attrs.field(factory=dict, init=False)
    _writer: ThreadPoolExecutor = attrs.field(
        factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="follower-spill"), init=False
    )
    _pending: dict[Key, Future[None]] = attrs.field(factory=dict, init=False)

    def longest(self, tokens: Sequence[int], adapter: str | None = None) -> tuple[Key, int] | None:
        return self.decision

    def restore(self, key: Key, adapter: str | None = None) -> Entry | None:
        return self._agreed.pop(key, None)

    def spill(self, entry: Entry) -> None:
        self._pending = {key: write for key, write in self._pending.items() if not write.done()}
        self.link.spill(entry)
        for job in self.link.outbox:
            if len(self._pending) >= _PENDING_WRITES:
                self.link.disk.note_dropped()
                continue
            self._pending[job.tokens] = self._writer.submit(self.link.disk.write, job)
        self.link.outbox.clear()

    def vote(self, key: Key, channel: Broadcast) -> None:
        """Read this rank's copy of `key` (waiting for its write if still queued) and vote with it."""
        if (write := self._pending.pop(key, None)) is not None:
            write.exception()  # waits; a failed write is the read's miss
        entry = self.link.load(key)
        if channel.agree(entry is not None) and entry is not None:
            self._agreed[key] = entry
        else:
            self.link.disk.discard(key)

    def statistics(self) -> DiskStatistics:
        return self.link.statistics()

    def close(self) -> None:
        self._writer.shutdown(wait=True)


def refuse(channel: Broadcast) -> None:
    """A rank without a disk tier votes no to every restore."""
    channel.agree(False)


def disk_op(op: dict[str, Any]) -> tuple[Key, int] | None:
    """The disk's answer a fetch op carries."""
    decision = op.get("disk")
    return None if decision is None else (tuple(decision[0]), int(decision[1]))
