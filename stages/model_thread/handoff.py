"""The crossing between the gateway's model thread and the event loop, without a round trip.

Model thread → loop: each step's outputs, with the spills and failed rows
it produced, go into a bounded buffer (`hand_over`), and the loop is woken
(`run_sync_soon`, which never waits) when the buffer was empty. The loop
delivers them in order (`deliver`). The thread waits here only while
`depth` steps are still undelivered: back-pressure, so a slow sink holds at
most that many steps on this side of the crossing.
Loop → model thread: new rows and aborts go into a locked intake (`feed`,
`abort`) that the thread takes whole at the top of each step (`take`). The
loop moves rows in only while the thread has free slots, so the rest stay
in the gateway's inbox, where admission counts them. The thread waits in
`take` only when it holds no row at all.
Shared state is guarded by one lock, held only to copy or count; the loop's
events are touched only on the loop.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream

from pipeline.channels import drain_nowait
from stages.cache.disk import SpillJob
from stages.messages import Abort, Prepared, StepOutputs
from stages.model_thread.exclusive import Job
from stages.model_thread.rows import Failed, Intake

# A waiting model thread looks for its host's cancellation at least this often. The host's cancellation also wakes
# it at once (`_wake_on_cancel`), so this is a backstop: ten looks a second were about a third of an idle worker's CPU.
_POLL_S = 1.0


@attrs.frozen(kw_only=True)
class Parcel:
    """What one step hands to the loop."""

    outputs: StepOutputs
    spills: tuple[SpillJob, ...] = ()
    failed: tuple[Failed, ...] = ()
    # Exclusive jobs (embeddings, scores) finished between steps.
    finished: tuple[Job[Any], ...] = ()

    @property
    def has_outputs(self) -> bool:
        """Rows admitted, tokens or rows removed: what the sink needs to see."""
        return bool(self.outputs.admitted or self.outputs.deltas or self.outputs.removed)


@attrs.frozen(kw_only=True)
class HandoffStatistics:
    # Steps the thread may run ahead of delivery before it waits.
    steps_ahead: int
    # Steps handed over and not yet delivered, now and at most since start.
    steps_undelivered: int
    steps_undelivered_max: int
    # Seconds the model thread waited because `steps_ahead` steps were undelivered.
    loop_wait_s: float
    # Seconds it waited with no row to run.
    idle_wait_s: float


@attrs.define(eq=False)
class Handoff:
    depth: int
    max_rows: int
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _changed: threading.Condition = attrs.field(init=False)
    # Thread → loop, guarded by the lock.
    _parcels: deque[Parcel] = attrs.field(factory=deque, init=False)
    _undelivered: int = attrs.field(default=0, init=False)
    _most_undelivered: int = attrs.field(default=0, init=False)
    _finished: bool = attrs.field(default=False, init=False)
    # Loop → thread, guarded by the lock.
    _rows: list[Prepared] = attrs.field(factory=list, init=False)
    _aborts: list[Abort] = attrs.field(factory=list, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Exclusive work arrived: an idle thread wakes to run it.
    _nudged: bool = attrs.field(default=False, init=False)
    # Rows the thread holds (in its batch or waiting), as it last said.
    _held: int = attrs.field(default=0, init=False)
    # The thread's finished waits, in seconds, and when the current one began (written by the thread only).
    _loop_wait: float = attrs.field(default=0.0, init=False)
    _idle_wait: float = attrs.field(default=0.0, init=False)
    _loop_wait_since: float | None = attrs.field(default=None, init=False)
    _idle_wait_since: float | None = attrs.field(default=None, init=False)
    # Set before the thread starts: a step's outputs are written by the thread with it, not handed to the loop
    # (in a model worker, its frame to the front); the rest of the parcel still crosses.
    direct: Callable[[StepOutputs], None] | None = attrs.field(default=None, init=False)
    # Loop side.
    _token: anyio.lowlevel.EventLoopToken | None = attrs.field(default=None, init=False)
    _ready: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _room: anyio.Event = attrs.field(factory=anyio.Event, init=False)

    def __attrs_post_init__(self) -> None:
        self._changed = threading.Condition(self._lock)

    def statistics(self) -> HandoffStatistics:
        # A wait still going on counts up to now, so two readings bracket a span exactly.
        with self._lock:
            now = time.perf_counter()
            loop_since, idle_since = self._loop_wait_since, self._idle_wait_since
            return HandoffStatistics(
                steps_ahead=self.depth,
                steps_undelivered=self._undelivered,
                steps_undelivered_max=self._most_undelivered,
                loop_wait_s=self._loop_wait + (now - loop_since if loop_since is not None else 0.0),
                idle_wait_s=self._idle_wait + (now - idle_since if idle_since is not None else 0.0),
            )

    # -- event loop ---------------------------------------------------------

    async def run(
        self,
        thread: Callable[[], Awaitable[object]],
        *,
        inbox: MemoryObjectReceiveStream[Prepared],
        control: MemoryObjectReceiveStream[Abort],
        bind: Callable[[Prepared], None],
        send: Callable[[Parcel], Awaitable[None]],
    ) -> None:
        """The loop's side while `thread` (the model thread's whole life) runs; then the last parcels are delivered."""
        self._token = anyio.lowlevel.current_token()
        async with anyio.create_task_group() as crossing:
            crossing.start_soon(self._deliver, send)
            async with anyio.create_task_group() as intake:
                intake.start_soon(self._feed, inbox, bind)
                intake.start_soon(self._forward, control)
                intake.start_soon(self._wake_on_cancel)
                await thread()
                intake.cancel_scope.cancel()
            self._finish()

    async def _deliver(self, send: Callable[[Parcel], Awaitable[None]]) -> None:
        """Deliver parcels in order until the thread has finished and none is left."""
        while True:
            with self._lock:
                parcel = self._parcels.popleft() if self._parcels else None
                finished = self._finished
            if parcel is None:
                if finished:
                    return
                await self._ready.wait()
                self._ready = anyio.Event()
                continue
            await send(parcel)
            with self._lock:
                self._undelivered -= 1
                self._changed.notify_all()
            self._room.set()

    async def _feed(self, inbox: MemoryObjectReceiveStream[Prepared], bind: Callable[[Prepared], None]) -> None:
        """Move rows from `inbox` into the intake while the thread has free slots; close it at the end."""
        try:
            while True:
                while self._free() <= 0:
                    await self._room.wait()
                    self._room = anyio.Event()
                try:
                    first = await inbox.receive()
                except anyio.EndOfStream:
                    return
                # Rows that arrived together cross together, so they prefill as one batch.
                rows = [first, *drain_nowait(inbox, limit=self._free() - 1)]
                live = [row for row in rows if not row.reply.closed]
                for row in live:
                    bind(row)
                with self._lock:
                    self._rows.extend(live)
                    self._changed.notify_all()
        finally:
            # Also on cancellation: an idle thread then ends at once.
            with self._lock:
                self._closed = True
                self._changed.notify_all()

    async def _forward(self, control: MemoryObjectReceiveStream[Abort]) -> None:
        async for abort in control:
            with self._lock:
                self._aborts.append(abort)

    async def _wake_on_cancel(self) -> None:
        """The thread waits on the condition; a cancelled host wakes it to look (`check_cancelled` raises there)."""
        try:
            await anyio.sleep_forever()
        finally:
            with self._lock:
                self._changed.notify_all()

    def _finish(self) -> None:
        """The thread has ended: `deliver` returns once the parcels left are delivered."""
        with self._lock:
            self._finished = True
        self._ready.set()

    def nudge(self) -> None:
        """Wake an idle thread for work that is not a row (exclusive work between steps)."""
        with self._lock:
            self._nudged = True
            self._changed.notify_all()

    def _free(self) -> int:
        with self._lock:
            return self.max_rows - self._held - len(self._rows)

    def _wake(self) -> None:
        self._ready.set()
        self._room.set()

    # -- model thread -------------------------------------------------------

    def take(self, *, held: int, other_work: bool = False) -> Intake:
        """New rows and aborts since the last step; waits while `held` (rows the thread has) is 0, none came
        and the thread has no `other_work` (exclusive work left queued) either."""
        with self._lock:
            self._held = held
            if not held and not other_work and not self._rows and not self._closed and not self._nudged:
                self._idle_wait_since = started = time.perf_counter()
                try:
                    while not self._rows and not self._closed and not self._nudged:
                        self._wait()
                finally:
                    self._idle_wait += time.perf_counter() - started
                    self._idle_wait_since = None
            self._nudged = False
            rows, aborts = tuple(self._rows), tuple(self._aborts)
            self._rows.clear()
            self._aborts.clear()
            self._held += len(rows)
            closed = self._closed and not self._held
        return Intake(aborts=aborts, admitted=rows, closed=closed)

    def hand_over(self, parcel: Parcel | None, *, held: int) -> None:
        """Hand a step's parcel to the loop; waits only while `depth` steps are undelivered."""
        if parcel is not None and self.direct is not None and parcel.has_outputs:
            self.direct(parcel.outputs)
            if parcel.spills or parcel.failed or parcel.finished:
                parcel = attrs.evolve(parcel, outputs=StepOutputs(admitted=(), deltas=(), stepped_at=time.monotonic()))
            else:
                parcel = None
        with self._lock:
            # Rows that left free slots the loop may be waiting for.
            wake = held < self._held
            self._held = held
            if parcel is not None:
                if self._undelivered >= self.depth:
                    self._loop_wait_since = started = time.perf_counter()
                    try:
                        while self._undelivered >= self.depth:
                            self._wait()
                    finally:
                        self._loop_wait += time.perf_counter() - started
                        self._loop_wait_since = None
                wake = wake or not self._parcels
                self._parcels.append(parcel)
                self._undelivered += 1
                self._most_undelivered = max(self._most_undelivered, self._undelivered)
        if wake:
            assert self._token is not None, "run() binds the loop before the thread starts"
            self._token.backend_class.run_sync_soon(self._wake, (), self._token.native_token)

    def _wait(self) -> None:
        # Called with the lock held; a host cancel ends the wait (the lock is released as it propagates).
        self._changed.wait(_POLL_S)
        anyio.from_thread.check_cancelled()
