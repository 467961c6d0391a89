"""The front's stand-in for the generation gateway: the model runs in a worker process behind it.

Same face as `GenerationGateway` (`run`, `statistics`, `cache_statistics`): it reads `Prepared` rows and aborts from
the pipeline and hands the sink one `StepOutputs` per decode step, so nothing upstream or downstream knows the model
is in another process. Underneath it supervises the worker (`stages/remote/process.py`): starts it, reads its
heartbeats, restarts it with back-off when it dies or hangs, and drains it on shutdown.

On a lost worker: every row and job in flight fails at once with 503 `worker_lost` (the stream protocols' `error()`
gives each API its terminal frame), the sink is told the rows are gone, and a new worker is started; rows that
arrive meanwhile wait in the inbox, where admission counts them.

A worker that never became ready on the first start fails the engine's start, as a model that cannot load does
in-process; one that refuses its model (`RefusedOut`: settings it cannot run, a model that does not load) says why
first, and is not restarted: the engine fails with that reason, which the front logs and `/health` and `/v1/models`
show. So does one whose first start dies before it is ready with no reason to send (a crash, an import that fails):
its reason is the end of what it printed to stderr. A start takes the idle spare worker when there is one
(stages/remote/spare.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.channels import Channel, open_channel
from pipeline.settings import Settings
from stages.cache.prompt import PromptCacheStatistics
from stages.messages import Abort, Prepared, StepOutputs
from stages.model_thread.gateway import GatewayStatistics
from stages.remote.convert import request_error, row_in, step_outputs
from stages.remote.exclusive import RemoteExclusiveQueue
from stages.remote.frames import FrameError, FrameReader, FrameWriter
from stages.remote.messages import (
    AbortIn,
    BeatOut,
    CloseIn,
    JobOut,
    ReadyOut,
    RefusedOut,
    SettingsIn,
    StatsIn,
    StepOut,
    ToFront,
    ToWorker,
)
from stages.remote.process import (
    WorkerDiedStarting,
    WorkerLost,
    WorkerProcess,
    WorkerRefused,
    exit_status,
    start_worker,
)
from stages.remote.spare import SPARES
from stages.remote.status import ServingCount, WorkerState, WorkerStatus, no_statistics, worker_lost

log = structlog.get_logger(stage="remote")

# Restarts in a row (none of them serving a request) after which the model is marked failed.
_MAX_FAILURES = 8
_MAX_BACKOFF_S = 30.0
# How late past the heartbeat bound the watch may look (so one look past the bound is enough).
_WATCH_SLACK_S = 0.01
# The heartbeat bound of a worker still loading its model, in bounds.
_LOADING_BOUND_FACTOR = 10
# A drained worker's time to finish and exit before it is killed.
_GRACE_S = 10.0
# A lost worker's time to exit on its own, printing why (a hung one is killed at once): docs/DESIGN.md.
_EXIT_GRACE_S = 2.0

_SERVING = ServingCount()


@attrs.define
class RemoteGateway:
    _inbox: MemoryObjectReceiveStream[Prepared] = attrs.field(alias="inbox")
    _control: MemoryObjectReceiveStream[Abort] = attrs.field(alias="control")
    _out: MemoryObjectSendStream[StepOutputs] = attrs.field(alias="out")
    # The control channel's own send end (the sink holds a clone): closed with the gateway, as in process.
    _aborts: MemoryObjectSendStream[Abort] = attrs.field(alias="aborts")
    _exclusive: RemoteExclusiveQueue = attrs.field(alias="exclusive")
    # What the worker is started with: its engine's settings.
    _settings: Settings = attrs.field(alias="settings")
    # Frames the front may have queued for the worker: a row, an abort and a job or its cancel per request in flight.
    _capacity: int = attrs.field(alias="capacity")
    _connect_timeout: float = attrs.field(default=600.0, alias="connect_timeout")
    # The front's measured memory copy figure, passed on to each worker it starts (SettingsIn says why).
    _measured_bandwidth: float | None = attrs.field(default=None, alias="measured_bandwidth")
    _state: WorkerState = attrs.field(default=WorkerState.LOADING, init=False)
    _worker: WorkerProcess | None = attrs.field(default=None, init=False)
    # The current worker's process, from its start (before it connects) to its end.
    _pid: int | None = attrs.field(default=None, init=False)
    _outbox: Channel[ToWorker] | None = attrs.field(default=None, init=False)
    # Rows sent to the current worker and not yet finished, removed or failed.
    _rows: dict[str, Prepared] = attrs.field(factory=dict, init=False)
    _restarts: int = attrs.field(default=0, init=False)
    _served: bool = attrs.field(default=False, init=False)
    _beat: BeatOut = attrs.field(factory=BeatOut, init=False)
    _beats: int = attrs.field(default=0, init=False)
    _beaten: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _last_frame: float = attrs.field(default=0.0, init=False)
    _reading_since: float | None = attrs.field(default=None, init=False)
    _ready: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _draining: bool = attrs.field(default=False, init=False)
    # A worker has been ready once: the engine has started.
    _started: bool = attrs.field(default=False, init=False)
    # Why the worker said it cannot serve this model: not restarted, the model fails with this reason.
    _refused: str | None = attrs.field(default=None, init=False)
    # The current worker is counted in `_SERVING`.
    _counted: bool = attrs.field(default=False, init=False)
    # The last worker lost was a spare that died before it was ready.
    _spare_lost: bool = attrs.field(default=False, init=False)
    # When the current worker's start began (its ready log says how long it took).
    _starting_at: float = attrs.field(default=0.0, init=False)
    # The gateway's own task group: a spare's start lives no longer than the gateway.
    _group: TaskGroup = attrs.field(init=False)

    def status(self) -> WorkerStatus:
        worker = self._worker
        spare, forked = (worker.spare, worker.forked) if worker is not None else (False, False)
        return WorkerStatus(state=self._state.value, pid=self._pid, restarts=self._restarts, spare=spare, forked=forked)

    def statistics(self) -> GatewayStatistics:
        pending = self._inbox.statistics().current_buffer_used
        if self._beat.gateway is not None:
            return attrs.evolve(self._beat.gateway, pending=pending)
        return no_statistics(pending)

    def cache_statistics(self) -> PromptCacheStatistics | None:
        return self._beat.prompt_cache

    async def refresh(self, timeout: float = 1.0) -> None:
        """Wait (bounded) for a heartbeat sent after this call, so `statistics()` covers every step delivered so far."""
        if not self._send(StatsIn()):
            return
        seen = self._beats
        with anyio.move_on_after(timeout):
            while self._beats == seen:
                await self._beaten.wait()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._exclusive.jobs.bind(self._send, self._wait_ready)
        SPARES.enter()
        group: TaskGroup | None = None
        try:
            async with self._inbox, self._control, self._aborts, self._out, anyio.create_task_group() as group:
                self._group = group
                group.start_soon(self._forward_aborts)
                await self._supervise(task_status)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await SPARES.leave(group)

    async def _supervise(self, task_status: TaskStatus[None]) -> None:
        failures = 0
        while True:
            reason = await self._serve_one(task_status)
            if reason is None:
                self._state = WorkerState.STOPPED
                return
            if self._refused is not None:
                # Settings the model cannot run with fail every start alike: no restart, the reason is the model's.
                self._state = WorkerState.FAILED
                raise WorkerRefused(self._refused)
            if not self._started and not self._spare_lost:
                # The first start failed: the engine does not start, as with a model that cannot load in-process;
                # nor does a later one (no restart, and the fleet's requests do not load it again: a refusal).
                self._state = WorkerState.FAILED
                raise WorkerDiedStarting(reason)
            failures = 1 if self._served else failures + 1
            self._served = False
            if failures > _MAX_FAILURES:
                self._state = WorkerState.FAILED
                raise WorkerLost(f"{failures} restarts in a row failed; the last: {reason}")
            self._state, self._restarts = WorkerState.RESTARTING, self._restarts + 1
            SPARES.restarts += 1
            delay = min(self._settings.worker_restart_backoff * 2 ** (failures - 1), _MAX_BACKOFF_S)
            log.warning("worker.restart", reason=reason, delay_s=delay, restarts=self._restarts)
            await anyio.sleep(delay)

    async def _serve_one(self, task_status: TaskStatus[None]) -> str | None:
        """Run one worker until it ends; None when it was drained, else why it was lost (its rows failed)."""
        lost: list[str] = []
        beside_others = _SERVING.count > 0
        self._starting_at = time.monotonic()
        try:
            worker = await SPARES.take() if SPARES.wanted(self._settings.worker_spare) else None
            if worker is None:
                worker = await start_worker(
                    connect_timeout=self._connect_timeout, yield_cpu=beside_others, spawned=self._spawned
                )
        except WorkerLost as error:
            log.error("worker.exited", pid=self._pid, reason=str(error), stderr=error.stderr)
            self._pid = None
            await self._lose(str(error))
            return str(error)
        self._worker, self._pid, ready = worker, worker.pid, self._ready
        self._spare_lost = False
        try:
            await self._session(worker, task_status, beside_others, lost.append)
            if lost and ready.is_set():
                # Its rows fail before its end is awaited: their clients hear of the loss at once.
                await self._lose(lost[0])
        finally:
            await worker.end(_EXIT_GRACE_S if lost else _GRACE_S)
            if self._counted:
                _SERVING.count, self._counted = _SERVING.count - 1, False
            self._worker, self._pid = None, None
        if not lost:
            return None
        status = exit_status(worker.process)
        if ready.is_set():
            # Its rows failed when it was lost; its traceback, if it printed one, ends its stderr.
            log.error("worker.exited", pid=worker.pid, status=status, stderr=await worker.last_words())
            return lost[0]
        reason = lost[0]
        if self._refused is None:
            # It died before it could say why (a crash while loading): what it printed is the reason.
            reason = f"{lost[0]} ({status}) before it was ready; {await worker.printed()}"
            # A spare that died idle says nothing of the model: the next start is a fresh worker's.
            self._spare_lost = worker.spare
        log.error("worker.exited", pid=worker.pid, status=status, stderr=worker.stderr.text())
        await self._lose(reason)
        return reason

    def _spawned(self, pid: int) -> None:
        self._pid = pid

    async def _session(
        self, worker: WorkerProcess, task_status: TaskStatus[None], beside_others: bool, lose: Callable[[str], None]
    ) -> None:
        self._outbox = open_channel(self._capacity, name="worker")
        try:
            # Never logged nor sent: the worker needs no keys.
            values = attrs.asdict(attrs.evolve(self._settings, api_key=None))
            first = SettingsIn(values=values, yield_cpu=beside_others, measured_bandwidth=self._measured_bandwidth)
            self._outbox.send.send_nowait(first)
            self._last_frame = time.monotonic()
            async with anyio.create_task_group() as session:
                session.start_soon(self._write, worker, self._outbox.receive)
                session.start_soon(self._watch, worker, lose, session.cancel_scope)
                await self._read(worker, task_status, session, lose)
                session.cancel_scope.cancel()
        finally:
            # What was queued for this worker dies with it (its rows were failed by the loss).
            self._outbox.send.close()
            self._outbox.receive.close()
            self._outbox = None

    async def _read(
        self,
        worker: WorkerProcess,
        task_status: TaskStatus[None],
        session: anyio.abc.TaskGroup,
        lose: Callable[[str], None],
    ) -> None:
        reader: FrameReader[ToFront] = FrameReader(worker.stream, ToFront)
        while True:
            self._reading_since = time.monotonic()
            try:
                message = await reader.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, FrameError, OSError) as error:
                if not (self._draining and not self._rows and isinstance(error, anyio.EndOfStream)):
                    lose(f"the worker (pid {worker.pid}) exited" if not isinstance(error, FrameError) else str(error))
                return
            finally:
                self._reading_since = None
            self._last_frame = time.monotonic()
            if isinstance(message, StepOut):
                await self._deliver(message)
            elif isinstance(message, JobOut):
                self._served = True
                self._exclusive.jobs.finish(message)
            elif isinstance(message, BeatOut):
                self._beat, self._exclusive.remote = message, message.exclusive
                self._beats += 1
                self._beaten.set()
                self._beaten = anyio.Event()
            elif isinstance(message, ReadyOut):
                self._on_ready(message, task_status, session)
            elif isinstance(message, RefusedOut):
                self._refused = message.reason
                log.error("worker.refused", pid=worker.pid, reason=message.reason)
                lose(f"the worker (pid {worker.pid}) refused to start: {message.reason}")
                return

    def _on_ready(self, ready: ReadyOut, task_status: TaskStatus[None], session: anyio.abc.TaskGroup) -> None:
        first, self._started = not self._started, True
        self._state = WorkerState.READY
        if not self._counted:
            _SERVING.count, self._counted = _SERVING.count + 1, True
        self._ready.set()
        spare = self._worker is not None and self._worker.spare
        start_s = round(time.monotonic() - self._starting_at, 3)
        log.info("worker.ready", pid=ready.pid, restarts=self._restarts, spare=spare, start_s=start_s)
        # The next start's spare imports now, nicer, once this worker no longer competes for the CPU.
        SPARES.refill(self._group, mode=self._settings.worker_spare, connect_timeout=self._connect_timeout)
        session.start_soon(self._feed)
        if first:
            task_status.started()

    async def _deliver(self, step: StepOut) -> None:
        for failed in step.failed:
            if (row := self._rows.pop(failed.request_id, None)) is not None:
                row.reply.fail(request_error(failed.error))
        outputs = step_outputs(step, self._rows)
        for delta in outputs.deltas:
            if delta.finish is not None and self._rows.pop(delta.request_id, None) is not None:
                self._served = True
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
            row.reply.bind_abort(partial(self._abort, row.request_id))
            await outbox.send.send(row_in(row))
        self._draining = True
        await outbox.send.send(CloseIn())

    async def _write(self, worker: WorkerProcess, outbox: MemoryObjectReceiveStream[ToWorker]) -> None:
        writer = FrameWriter(worker.stream)
        async for message in outbox:
            try:
                await writer.send(message)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the reader sees the worker go

    async def _watch(self, worker: WorkerProcess, lose: Callable[[str], None], scope: anyio.CancelScope) -> None:
        """A worker silent past the heartbeat bound while the front waits on it is hung: it is killed."""
        while True:
            # A loading worker's beats come from its loop beside the threads that load the model, which hold the
            # interpreter lock for long stretches (and it runs nicer beside other workers): it has a longer bound.
            ready, beat_bound = self._ready.is_set(), self._settings.worker_heartbeat_timeout
            bound = beat_bound * (1 if ready else _LOADING_BOUND_FACTOR)
            # Wakes at the earliest moment the worker could be past the bound, not on a short poll:
            # a healthy worker's frames keep moving that moment on, so an idle front wakes about once a bound.
            since = self._reading_since
            silent = time.monotonic() - max(since, self._last_frame) if since is not None else 0.0
            if silent > bound:
                lose(f"the worker (pid {worker.pid}) sent no heartbeat for {bound:g} s")
                log.error("worker.hung", pid=worker.pid, bound_s=bound)
                worker.kill()
                scope.cancel()
                return
            # At most one beat bound: a worker that becomes ready meanwhile is held to it from then on.
            await anyio.sleep(min(bound - silent, beat_bound) + _WATCH_SLACK_S)

    async def _lose(self, reason: str) -> None:
        """Everything the lost worker held fails now; the sink drops the rows' state."""
        log.error("worker.lost", reason=reason, rows=len(self._rows))
        self._state = WorkerState.RESTARTING
        self._ready = anyio.Event()
        self._beat = BeatOut()
        error = worker_lost(reason)
        rows, self._rows = self._rows, {}
        for row in rows.values():
            row.reply.fail(error)
        self._exclusive.jobs.fail_all(error)
        if rows:
            await self._out.send(StepOutputs(admitted=(), deltas=(), stepped_at=time.monotonic(), removed=tuple(rows)))

    def _abort(self, request_id: str) -> None:
        if request_id in self._rows and self._outbox is not None:
            try:
                self._outbox.send.send_nowait(AbortIn(request_id=request_id))
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                log.warning("worker.abort_dropped", request_id=request_id)

    async def _forward_aborts(self) -> None:
        async for abort in self._control:
            self._abort(abort.request_id)

    async def _wait_ready(self) -> None:
        await self._ready.wait()

    def _send(self, job: ToWorker) -> bool:
        if self._outbox is None or not self._ready.is_set():
            return False
        try:
            self._outbox.send.send_nowait(job)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True
