"""The disk tier's writer, a task beside the gateway.

Evicted prompt-cache entries are offered from the event loop (`offer`,
which never waits: the request path does not wait on the disk, so a full
queue drops the entry) and written one at a time on a thread of their own
(`run`). A write that fails, for any reason, costs that entry alone: it is
counted and dropped, never the engine's failure.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.to_thread
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.actor import isolated_task
from stages.cache.disk import DiskTier, SpillJob


@attrs.define
class Spiller:
    _disk: DiskTier | None = attrs.field(alias="disk")
    _send: MemoryObjectSendStream[SpillJob] = attrs.field(alias="send")
    _receive: MemoryObjectReceiveStream[SpillJob] = attrs.field(alias="receive")

    def offer(self, spills: Sequence[SpillJob]) -> None:
        for job in spills:
            try:
                self._send.send_nowait(job)
            except anyio.WouldBlock:
                if self._disk is not None:
                    self._disk.note_dropped()

    def close(self) -> None:
        """No more entries: `run` writes those queued, then returns."""
        self._send.close()

    async def run(self) -> None:
        writes = anyio.CapacityLimiter(1)
        async with self._receive:
            async for job in self._receive:
                if self._disk is None:
                    continue
                with isolated_task("prompt_cache.spill", on_error=self._disk.note_error):
                    await anyio.to_thread.run_sync(self._disk.write, job, limiter=writes)
