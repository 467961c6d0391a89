"""The front's stand-in for the generation gateway: the model runs in a worker process it supervises.

Same face as `GenerationGateway` (stages/engine/gateway_face.py's `Gateway`): the engine hands `RemoteGateway` the
pipeline's `Prepared` rows and aborts and gets one `StepOutputs` per decode step, so nothing upstream or downstream
knows the model is in another process. The worker's life (start, spare, heartbeat watch, restart with back-off,
drain) is its `Supervisor`'s (stages/remote/supervisor.py), the policy a speech model's worker has too; this
module is the chat kind of worker: what one worker's connection holds is its `WorkerSession`
(stages/remote/session.py: its frames, its rows, its heartbeats' figures), its first frame is the engine's
settings and start-up decisions (`SettingsIn`), and on a lost worker every row and job in flight fails at once
with 503 `worker_lost` (the stream protocols' `error()` gives each API its terminal frame) and the sink is told the
rows are gone; rows that arrive meanwhile wait in the inbox, where admission counts them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import anyio
import attrs
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.errors import RequestError
from pipeline.settings import Settings
from stages.cache.prompt import PromptCacheStatistics
from stages.messages import Abort, Prepared, StepOutputs
from stages.model_thread.gateway import GatewayStatistics
from stages.remote.crossing import ReadyOut, SettingsIn, StartIn, StatsIn, ToWorker
from stages.remote.exclusive_queue import RemoteExclusiveQueue
from stages.remote.process import WorkerProcess
from stages.remote.session import WorkerSession
from stages.remote.status import WorkerStatus, no_statistics
from stages.remote.supervisor import Supervisor


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
    # Frames the front may queue for one worker (`WorkerSession`'s outbox).
    _capacity: int = attrs.field(alias="capacity")
    # The front's start-up decisions, sent to each worker it starts (stages/remote/crossing.py, StartIn).
    _start: StartIn = attrs.field(alias="start", kw_only=True)
    _connect_timeout: float = attrs.field(default=600.0, alias="connect_timeout")
    _supervisor: Supervisor[WorkerSession] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._supervisor = Supervisor(kind=self, settings=self._settings, connect_timeout=self._connect_timeout)

    def status(self) -> WorkerStatus:
        return self._supervisor.status()

    def statistics(self) -> GatewayStatistics:
        pending = self._inbox.statistics().current_buffer_used
        session = self._supervisor.session
        return session.statistics(pending) if session is not None else no_statistics(pending)

    def cache_statistics(self) -> PromptCacheStatistics | None:
        session = self._supervisor.session
        return session.cache_statistics() if session is not None else None

    async def refresh(self, timeout: float = 1.0) -> None:
        """Wait (bounded) for a heartbeat sent after this call, so `statistics()` covers every step delivered so far."""
        session = self._supervisor.session
        if session is None or not self._send(StatsIn()):
            return
        await session.beat_after(timeout)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._exclusive.jobs.bind(self._send, self._supervisor.wait_ready)
        async with self._inbox, self._control, self._aborts, self._out, anyio.create_task_group() as group:
            group.start_soon(self._forward_aborts)
            await self._supervisor.run(task_status.started)
            group.cancel_scope.cancel()

    # The chat kind of worker, as its supervisor asks (stages/remote/supervisor.py's `SessionKind`).

    def session(
        self, worker: WorkerProcess, *, on_ready: Callable[[ReadyOut], None], lose: Callable[[str], None]
    ) -> WorkerSession:
        return WorkerSession(
            worker=worker,
            inbox=self._inbox,
            out=self._out,
            exclusive=self._exclusive,
            capacity=self._capacity,
            on_ready=on_ready,
            lose=lose,
        )

    def first_frame(self, beside_others: bool) -> SettingsIn:
        # Never logged nor sent: the worker needs no keys.
        values = attrs.asdict(attrs.evolve(self._settings, api_key=None))
        return SettingsIn(values=values, start=self._start, yield_cpu=beside_others)

    def on_ready(self, message: ReadyOut) -> None:
        pass

    def held(self, session: WorkerSession | None) -> Mapping[str, int]:
        return {"rows": session.rows if session is not None else 0}

    async def fail(self, session: WorkerSession | None, error: RequestError) -> None:
        """Every row and job fails; the sink drops the rows' state."""
        removed = session.fail(error) if session is not None else ()
        self._exclusive.jobs.fail_all(error)
        if removed:
            await self._out.send(StepOutputs(admitted=(), deltas=(), stepped_at=time.monotonic(), removed=removed))

    async def _forward_aborts(self) -> None:
        async for abort in self._control:
            if (session := self._supervisor.session) is not None:
                session.abort(abort.request_id)

    def _send(self, message: ToWorker) -> bool:
        session = self._supervisor.session
        return self._supervisor.is_ready and session is not None and session.send(message)
