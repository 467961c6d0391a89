"""One live connection to a model worker: its frames both ways, the rows it holds, its heartbeats' figures.

A `WorkerSession` lives from the worker's start to its end and no longer; the supervisor
(stages/remote/supervisor.py) starts one per worker, as `RemoteGateway` (stages/remote/chat_gateway.py) makes it,
and decides what a loss means. The session owns what dies with the connection: the outbox of frames queued for the
worker (its `SettingsIn` first), the rows sent to it and not yet finished, which fail with 503 `worker_lost` when it
is lost (`fail`), and the last heartbeat's figures. The frames both ways, the heartbeat clock and the
ready/refused/served flags are every session's (`stages/remote/connection.py`); each frame the worker sends is
handled here by its type (`_handle`); once the worker says it is ready the session feeds it rows from the pipeline's
inbox, and once that inbox closes it asks the worker to finish and end (`CloseIn`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.errors import RequestError
from stages.cache.prompt import PromptCacheStatistics
from stages.messages import Prepared, StepOutputs
from stages.model_thread.gateway import GatewayStatistics
from stages.remote.connection import WorkerConnection
from stages.remote.convert import request_error, row_in, step_outputs
from stages.remote.crossing import (
    AbortIn,
    BeatOut,
    CloseIn,
    JobOut,
    ReadyOut,
    RefusedOut,
    StepOut,
    ToFront,
)
from stages.remote.exclusive_queue import RemoteExclusiveQueue
from stages.remote.status import no_statistics

log = structlog.get_logger(stage="remote")


@attrs.define(eq=False, kw_only=True)
class WorkerSession(WorkerConnection):
    incoming: ClassVar[Any] = ToFront
    outbox_name: ClassVar[str] = "worker"

    _inbox: MemoryObjectReceiveStream[Prepared] = attrs.field(alias="inbox")
    _out: MemoryObjectSendStream[StepOutputs] = attrs.field(alias="out")
    _exclusive: RemoteExclusiveQueue = attrs.field(alias="exclusive")
    # Rows sent to this worker and not yet finished, removed or failed.
    _rows: dict[str, Prepared] = attrs.field(factory=dict, init=False)
    _draining: bool = attrs.field(default=False, init=False)
    _beat: BeatOut = attrs.field(factory=BeatOut, init=False)
    _beats: int = attrs.field(default=0, init=False)
    _beaten: anyio.Event = attrs.field(factory=anyio.Event, init=False)

    @property
    def rows(self) -> int:
        return len(self._rows)

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

    def abort(self, request_id: str) -> None:
        if request_id in self._rows and not self._queue(AbortIn(request_id=request_id)):
            log.warning("worker.abort_dropped", request_id=request_id)

    def fail(self, error: RequestError) -> tuple[str, ...]:
        """Every row this worker held fails with `error`; returns their ids, whose state the sink must drop."""
        rows, self._rows = self._rows, {}
        for row in rows.values():
            row.reply.fail(error)
        return tuple(rows)

    def _ended_cleanly(self, error: BaseException) -> bool:
        # Drained: the worker finished the rows it held and ended, as `CloseIn` asked.
        return self._draining and not self._rows and isinstance(error, anyio.EndOfStream)

    async def _handle(self, message: ToFront, group: TaskGroup) -> bool:
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
                return self._refuse(message.reason)
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
            try:
                # The sink usually waits for it: handed over without `send`'s checkpoint, a turn of the loop per step
                # (the channel's bound still holds the reader back when the sink is behind).
                self._out.send_nowait(outputs)
            except anyio.WouldBlock:
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
