"""One clock for every open stream's keepalive frame.

A stream that has had nothing to send for `interval` (a long prefill, a
queue, a tool call held back) sends a keepalive frame, so that proxies and
clients keep the connection. Each stream once waited for its next events
under a deadline of its own, which cost every streamed token a timer set
and cancelled: about a tenth of the front's CPU per token with 16 streams
(docs/benchmarks.md, "A request's own cost in the front"). Now one task
looks at the open streams `TICKS` times an interval and nudges each that
took nothing since its last look `TICKS` times running: a keepalive
follows a stream's last output after between one and 1 + 1/`TICKS`
intervals.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import attrs
from anyio.abc import TaskStatus

from stages.messages import Reply

TICKS = 4


@attrs.define
class _Watch:
    taken: int
    quiet_ticks: int = 0


@attrs.define
class Keepalives:
    interval: float
    _streams: dict[Reply, _Watch] = attrs.field(factory=dict, init=False)
    # What the clock waits on while it watches no stream, set when one opens: an idle front's every wake-up runs on
    # cold caches, about a millisecond of CPU beside a busy model worker (docs/benchmarks.md).
    _watched: anyio.Event | None = attrs.field(default=None, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if not self._streams:
                self._watched = anyio.Event()
                await self._watched.wait()
            await anyio.sleep(self.interval / TICKS)
            self.tick()

    def tick(self) -> None:
        """One look at every open stream: nudge those that have taken nothing for a whole interval."""
        for reply, watch in self._streams.items():
            if reply.taken != watch.taken:
                watch.taken, watch.quiet_ticks = reply.taken, 0
                continue
            watch.quiet_ticks += 1
            if watch.quiet_ticks >= TICKS:
                watch.quiet_ticks = 0
                reply.nudge()

    @contextmanager
    def watching(self, reply: Reply) -> Iterator[None]:
        self._streams[reply] = _Watch(taken=reply.taken)
        if self._watched is not None:
            self._watched.set()
        try:
            yield
        finally:
            del self._streams[reply]
