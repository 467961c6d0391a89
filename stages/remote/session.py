"""One live connection to a model worker: its frames both ways, the rows it holds, its heartbeats' figures.

A `WorkerSession` lives from the worker's start to its end and no longer; the supervisor
(stages/remote/supervisor.py) starts one per worker, as `RemoteGateway` (stages/remote/chat_gateway.py) makes it, and
decides what a loss means. The session owns what dies
with the connection: the outbox of frames queued for the worker (its `SettingsIn` first), the rows sent to it and
not yet finished, which fail with 503 `worker_lost` when it is lost (`fail`), and the last heartbeat's figures.
Each frame the worker sends is handled by its type (`_handle`); once the worker says it is ready the session feeds
it rows from the pipeline's inbox, and once that inbox closes it asks the worker to finish and end (`CloseIn`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.channels import Channel, open_channel
from pipeline.errors import RequestError
from stages.cache.prompt import PromptCacheStatistics
from stages.messages import Prepared, StepOutputs
from stages.model_thread.gateway import GatewayStatistics
from stages.remote.convert import request_error, row_in, step_outputs
from stages.remote.crossing import (
    AbortIn,
    BeatOut,
    CloseIn,
    JobOut,
    ReadyOut,
    RefusedOut,
    SettingsIn,
    StepOut,
    ToFront,
    ToWorker,
)
from stages.remote.exclusive_queue import RemoteExclusiveQueue
from stages.remote.frames import FrameError, FrameReader, FrameWriter
from stages.remote.process import WorkerProcess
from stages.remote.status import no_statistics

log = structlog.get_logger(stage="remote")


@attrs.define(eq=False)
class WorkerSession:
    worker: WorkerProcess
    _inbox: MemoryObjectReceiveStream[Prepared] = attrs.field(alias="inbox")
    _out: MemoryObjectSendStream[StepOutputs] = attrs.field(alias="out")
    _exclusive: RemoteExclusiveQueue = attrs.field(alias="exclusive")
    # Frames the front may have queued for the worker: a row, an abort and a job or its cancel per request in flight.
    _capacity: int = attrs.field(alias="capacity")
    # Told of the worker's `ReadyOut` (the supervisor's state, its start's log, the engine's start).
    _on_ready: Callable[[ReadyOut], None] = attrs.field(alias="on_ready")
    # Told why the worker is lost (its end, a bad frame, its refusal); the supervisor keeps the first.
    _lose: Callable[[str], None] = attrs.field(alias="lose")
    # Why the worker said it cannot serve its model: the supervisor does not restart it.
    refused: str | None = attrs.field(default=None, init=False)
    # It finished a row or a job: its loss does not count towards the restarts in a row that fail the model.
    served: bool = attrs.field(default=False, init=False)
    ready: bool = attrs.field(default=False, init=False)
    _outbox: Channel[ToWorker] | None = attrs.field(default=None, init=False)
    # Rows sent to this worker and not yet finished, removed or failed.
    _rows: dict[str, Prepared] = attrs.field(factory=dict, init=False)
    _draining: bool = attrs.field(default=False, init=False)
    _beat: BeatOut = attrs.field(factory=BeatOut, init=False)
    _beats: int = attrs.field(default=0, init=False)
    _beaten: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    # The heartbeat watch's clock: the last frame read, and since when a read has waited (None: not reading).
    _last_frame: float = attrs.field(factory=time.monotonic, init=False)
    _reading_since: float | None = attrs.field(default=None, init=False)

    @property
    def rows(self) -> int:
        return len(self._rows)

    def silent_s(self) -> float:
        """How long the worker has kept the front waiting on its next frame (0 while the front is not waiting)."""
        since = self._reading_since
        return time.monotonic() - max(since, self._last_frame) if since is not None else 0.0

    def statistics(self, pending: int) -> GatewayStatistics:
        if self._beat.gateway is not None:
            return attrs.evolve(self._beat.gateway, pending=pending)
        return no_statistics(pending)

    def cache_statistics(self) -> PromptCacheStatistics | None:
        return self._beat.prompt_cache

    async def beat_after(self, timeout: float) -> None:
        """Wait (bounded) for a heartbeat after the last one seen now."""
        seen = self._beats
        with anyio.move_on_after(timeout):
            while self._beats == seen:
                await self._beaten.wait()

    async def run(self, first: SettingsIn) -> None:
        """Send `first`, then serve frames until the worker ends or is lost; what is queued for it dies with it."""
        self._outbox = open_channel(self._capacity, name="worker")
        try:
            self._outbox.send.send_nowait(first)
            self._last_frame = time.monotonic()
            async with anyio.create_task_group() as group:
                group.start_soon(self._write, self._outbox.receive)
                await self._read(group)
                group.cancel_scope.cancel()
        finally:
            # Its rows were failed by the loss, or finished before its end.
            self._outbox.send.close()
            self._outbox.receive.close()
            self._outbox = None

    def send(self, message: ToWorker) -> bool:
        """Queue `message` for a ready worker; False when it is not ready, gone, or its outbox is full."""
        if self._outbox is None or not self.ready:
            return False
        try:
            self._outbox.send.send_nowait(message)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    def abort(self, request_id: str) -> None:
        if request_id in self._rows and self._outbox is not None:
            try:
                self._outbox.send.send_nowait(AbortIn(request_id=request_id))
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                log.warning("worker.abort_dropped", request_id=request_id)

    def fail(self, error: RequestError) -> tuple[str, ...]:
        """Every row this worker held fails with `error`; returns their ids, whose state the sink must drop."""
        rows, self._rows = self._rows, {}
        for row in rows.values():
            row.reply.fail(error)
        return tuple(rows)

    async def _read(self, group: TaskGroup) -> None:
        reader: FrameReader[ToFront] = FrameReader(self.worker.stream, ToFront)
        pid = self.worker.pid
        while True:
            self._reading_since = time.monotonic()
            try:
                message = await reader.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, FrameError, OSError) as error:
                if not (self._draining and not self._rows and isinstance(error, anyio.EndOfStream)):
                    self._lose(f"the worker (pid {pid}) exited" if not isinstance(error, FrameError) else str(error))
                return
            finally:
                self._reading_since = None
            self._last_frame = time.monotonic()
            if not await self._handle(message, group):
                return

    async def _handle(self, message: ToFront, group: TaskGroup) -> bool:
        """Act on one frame from the worker; False when the session ends with it."""
        match message:
            case StepOut():
                await self._deliver(message)
            case JobOut():
                self.served = True
                self._exclusive.jobs.finish(message)
            case BeatOut():
                self._beat, self._exclusive.remote = message, message.exclusive
                self._beats += 1
                self._beaten.set()
                self._beaten = anyio.Event()
            case ReadyOut():
                self.ready = True
                self._on_ready(message)
                group.start_soon(self._feed)
            case RefusedOut():
                self.refused = message.reason
                log.error("worker.refused", pid=self.worker.pid, reason=message.reason)
                self._lose(f"the worker (pid {self.worker.pid}) refused to start: {message.reason}")
                return False
        return True

    async def _deliver(self, step: StepOut) -> None:
        for failed in step.failed:
            if (row := self._rows.pop(failed.request_id, None)) is not None:
                row.reply.fail(request_error(failed.error))
        outputs = step_outputs(step, self._rows)
        for delta in outputs.deltas:
            if delta.finish is not None and self._rows.pop(delta.request_id, None) is not None:
                self.served = True
        for request_id in outputs.removed:
            self._rows.pop(request_id, None)
        if outputs.admitted or outputs.deltas or outputs.removed:
            await self._out.send(outputs)

    async def _feed(self) -> None:
        """Rows from the pipeline to the worker; once the pipeline closes, the worker is drained."""
        outbox = self._outbox
        assert outbox is not None
        async for row in self._inbox:
            if row.reply.closed:
                continue
            self._rows[row.request_id] = row
            row.reply.bind_abort(partial(self.abort, row.request_id))
            await outbox.send.send(row_in(row))
        self._draining = True
        await outbox.send.send(CloseIn())

    async def _write(self, outbox: MemoryObjectReceiveStream[ToWorker]) -> None:
        writer = FrameWriter(self.worker.stream)
        async for message in outbox:
            try:
                await writer.send(message)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the reader sees the worker go
