"""A worker's heartbeats to its front, at the cadence both hosts share (workers/host.py, workers/speech_host.py).

Takes the beat interval, what "holding work" means to its host (`holding`) and the beat frame's maker (`beat`,
which may raise to end the worker, as a speech host's dead model thread does). Gives out one frame per beat on
the host's `FramesOut`: every interval while the host holds work, every fourth while it holds none, and at once
after `wake` (work came). A beat is skipped, its frame not even made, while another frame is on its way: the front
hears from the worker anyway. Ends when the front is gone.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import attrs

from workers.frames_out import FramesOut

# Beats this many intervals apart while the worker holds no work: nothing is in flight for the front to wait on
# (work that arrives wakes the beats at once). At the working cadence, an idle chat worker's beats (their
# statistics built, framed and read) were about half of its CPU and a quarter of its front's.
_IDLE_BEATS_APART = 4


@attrs.define
class Beats:
    interval: float
    # Loading, or work in hand: the front may be waiting on this worker.
    holding: Callable[[], bool]
    beat: Callable[[], object]
    _work_came: anyio.Event = attrs.field(factory=anyio.Event, init=False)

    def wake(self) -> None:
        """Work came: the next beat goes out now, and the working cadence resumes."""
        self._work_came.set()

    async def run(self, frames: FramesOut) -> None:
        while not frames.front_gone:
            if not frames.busy:
                await frames.send(self.beat())
            if self.holding():
                await anyio.sleep(self.interval)
                continue
            with anyio.move_on_after(self.interval * _IDLE_BEATS_APART):
                await self._work_came.wait()
            self._work_came = anyio.Event()
