"""The supervision of a model's worker process: one policy for every kind of worker, chat or speech.

A `Supervisor` owns a worker's life: its start (taking the idle spare worker when there is one,
stages/remote/spare.py, else one from stages/remote/process.py, forked by the zygote where it may be), the
heartbeat watch that kills a hung worker, the restart with back-off when one dies or hangs, and the drain, grace
and kill at the end; it reports the worker's state, process and restarts (`WorkerStatus`) and logs the `worker.*`
events. What differs between kinds of worker is its `SessionKind`: the chat model's `RemoteGateway`
(stages/remote/chat_gateway.py, over a `WorkerSession` of rows) and the speech model's `RemoteSpeech`
(stages/remote/speech_gateway.py, over a `SpeechSession` of transcriptions) each say what one worker's connection
is, the first frame it is sent, and what fails when a worker is lost.

On a lost worker: everything it held fails at once with 503 `worker_lost` (the kind's `fail`), and a new worker is
started after `worker_restart_backoff`·2^n s (capped at 30 s); work that arrives meanwhile waits for it. After 8
restarts in a row that served nothing the model is failed.

A worker that never became ready on the first start fails the engine's start, as a model that cannot load does
in-process; one that refuses its model (`RefusedOut`: settings it cannot run, a model that does not load) says why
first, and is not restarted: the engine fails with that reason, which the front logs and `/health` and `/v1/models`
show. So does one whose first start dies before it is ready with no reason to send (a crash, an import that fails):
its reason is the end of what it printed to stderr.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup

from pipeline.errors import RequestError
from pipeline.settings import Settings
from stages.remote.process import (
    WorkerDiedStarting,
    WorkerLost,
    WorkerProcess,
    WorkerRefused,
    exit_status,
    start_worker,
)
from stages.remote.spare import SPARES
from stages.remote.status import ServingCount, WorkerState, WorkerStatus, worker_lost

log = structlog.get_logger(stage="remote")

# Restarts in a row (none of them serving a request) after which the model is marked failed.
_MAX_FAILURES = 8
_MAX_BACKOFF_S = 30.0
# How late past the heartbeat bound the watch may look (so one look past the bound is enough).
_WATCH_SLACK_S = 0.01
# The heartbeat bound of a worker still loading its model, in bounds.
_LOADING_BOUND_FACTOR = 10
# A drained worker's time to finish and exit before it is killed.
GRACE_S = 10.0
# A lost worker's time to exit on its own, printing why (a hung one is killed at once): docs/DESIGN.md.
EXIT_GRACE_S = 2.0

# Process-wide, not per supervisor: it counts the ready workers of every model this front serves, so a worker that
# starts beside them yields the CPU (`yield_cpu`) while one alone starts at full speed.
_SERVING = ServingCount()


class Session(Protocol):
    """One worker's connection, as the supervisor sees it (stages/remote/session.py, speech_session.py)."""

    @property
    def worker(self) -> WorkerProcess: ...
    @property
    def ready(self) -> bool: ...
    @property
    def refused(self) -> str | None: ...
    @property
    def served(self) -> bool: ...
    def silent_s(self) -> float: ...
    async def run(self, first: Any) -> None: ...


S = TypeVar("S", bound=Session)


class SessionKind(Protocol[S]):
    """What one kind of worker supplies to its supervisor."""

    def session(self, worker: WorkerProcess, *, on_ready: Callable[[Any], None], lose: Callable[[str], None]) -> S:
        """A session for a started worker: it tells `on_ready` its ready frame and `lose` why it is lost."""
        ...

    def first_frame(self, beside_others: bool) -> Any:
        """The frame a worker is sent first (its settings); `beside_others`: it loads nicer."""
        ...

    def on_ready(self, message: Any) -> None:
        """The worker's ready frame, before the supervisor marks it ready."""
        ...

    def held(self, session: S | None) -> Mapping[str, int]:
        """What the lost worker's session held, for its `worker.lost` line."""
        ...

    async def fail(self, session: S | None, error: RequestError) -> None:
        """Everything the lost worker held fails with `error` (None: it never connected)."""
        ...


@attrs.define(eq=False)
class Supervisor(Generic[S]):
    _kind: SessionKind[S] = attrs.field(alias="kind")
    # What each worker is started with: its engine's settings.
    _settings: Settings = attrs.field(alias="settings")
    _connect_timeout: float = attrs.field(default=600.0, alias="connect_timeout")
    # A worker's time to finish and exit at its end when it was not lost.
    _end_grace: float = attrs.field(default=GRACE_S, alias="end_grace")
    # Fields every `worker.*` line of this supervisor carries (a speech model's name).
    _log_fields: Mapping[str, str] = attrs.field(factory=dict, alias="log_fields")
    _log: Any = attrs.field(init=False)
    state: WorkerState = attrs.field(default=WorkerState.LOADING, init=False)
    # The current worker's session; kept after a drained worker's end (its last figures), dropped when one is lost.
    _session: S | None = attrs.field(default=None, init=False)
    # The current worker's process, from its start (before it connects) to its end.
    _pid: int | None = attrs.field(default=None, init=False)
    _restarts: int = attrs.field(default=0, init=False)
    # Set while a worker is ready; what work waits for across restarts.
    _ready: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    # A worker has been ready once: the engine has started.
    _started: bool = attrs.field(default=False, init=False)
    # The current worker is counted in `_SERVING`.
    _counted: bool = attrs.field(default=False, init=False)
    # The last worker lost was a spare that died before it was ready.
    _spare_lost: bool = attrs.field(default=False, init=False)
    # When the current worker's start began (its ready log says how long it took).
    _starting_at: float = attrs.field(default=0.0, init=False)
    # The supervisor's own task group: a spare's start lives no longer than it.
    _group: TaskGroup = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._log = log.bind(**self._log_fields)

    @property
    def session(self) -> S | None:
        return self._session

    @property
    def failed(self) -> bool:
        return self.state is WorkerState.FAILED

    @property
    def is_ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def wake_waiters(self) -> None:
        """Whoever waits for a worker wakes (to see the model stopped: no worker will be ready again)."""
        self._ready.set()

    def status(self) -> WorkerStatus:
        worker = self._session.worker if self._session is not None and self._pid is not None else None
        spare, forked = (worker.spare, worker.forked) if worker is not None else (False, False)
        return WorkerStatus(state=self.state.value, pid=self._pid, restarts=self._restarts, spare=spare, forked=forked)

    async def run(self, ready: Callable[[], None]) -> None:
        """Start the worker, call `ready` once it first is, and supervise it until it is drained or cancelled.

        Raises:
            WorkerRefused: the worker refused its model.
            WorkerDiedStarting: its first start died before it was ready.
            WorkerLost: 8 restarts in a row served nothing.
        """
        SPARES.enter()
        group: TaskGroup | None = None
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                await self._supervise(ready)
                group.cancel_scope.cancel()
        finally:
            if self.state is not WorkerState.FAILED:
                self.state = WorkerState.STOPPED
            with anyio.CancelScope(shield=True):
                await SPARES.leave(group)

    async def _supervise(self, ready: Callable[[], None]) -> None:
        failures = 0
        while True:
            reason, session = await self._serve_one(ready)
            if reason is None:
                return
            if session is not None and session.refused is not None:
                # Settings the model cannot run with fail every start alike: no restart, the reason is the model's.
                self._fail(WorkerRefused(session.refused))
            if not self._started and not self._spare_lost:
                # The first start failed: the engine does not start, as with a model that cannot load in-process;
                # nor does a later one (no restart, and the fleet's requests do not load it again: a refusal).
                self._fail(WorkerDiedStarting(reason))
            failures = 1 if session is not None and session.served else failures + 1
            if failures > _MAX_FAILURES:
                self._fail(WorkerLost(f"{failures} restarts in a row failed; the last: {reason}"))
            self.state, self._restarts = WorkerState.RESTARTING, self._restarts + 1
            SPARES.restarts += 1
            delay = min(self._settings.worker_restart_backoff * 2 ** (failures - 1), _MAX_BACKOFF_S)
            self._log.warning("worker.restart", reason=reason, delay_s=delay, restarts=self._restarts)
            await anyio.sleep(delay)

    def _fail(self, error: Exception) -> None:
        self.state = WorkerState.FAILED
        raise error

    async def _serve_one(self, ready: Callable[[], None]) -> tuple[str | None, S | None]:
        """Run one worker until it ends: None when it was drained, else why it was lost (what it held failed); and
        its session, if it connected."""
        beside_others = _SERVING.count > 0
        self._starting_at = time.monotonic()
        try:
            worker = await SPARES.take() if SPARES.wanted(self._settings.worker_spare) else None
            if worker is None:
                worker = await start_worker(
                    connect_timeout=self._connect_timeout, yield_cpu=beside_others, spawned=self._spawned
                )
        except WorkerLost as error:
            self._log.error("worker.exited", pid=self._pid, reason=str(error), stderr=error.stderr)
            self._pid = None
            await self._lose(str(error))
            return str(error), None
        lost: list[str] = []
        session = self._session = self._kind.session(
            worker, on_ready=lambda message: self._on_ready(message, worker, ready), lose=lost.append
        )
        self._pid, self._spare_lost = worker.pid, False
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch, session, lost.append, group.cancel_scope)
                await session.run(self._kind.first_frame(beside_others))
                group.cancel_scope.cancel()
            if lost and session.ready:
                # What it held fails before its end is awaited: the clients hear of the loss at once.
                await self._lose(lost[0])
        finally:
            await worker.end(EXIT_GRACE_S if lost else self._end_grace)
            if self._counted:
                _SERVING.count, self._counted = _SERVING.count - 1, False
            self._pid = None
        if not lost:
            return None, session
        return await self._ended(worker, session, lost[0]), session

    async def _ended(self, worker: WorkerProcess, session: S, reason: str) -> str:
        """Log a lost worker's end with what it printed; one lost before it was ready is lost now. Why it was lost."""
        status = exit_status(worker.process)
        if session.ready:
            # What it held failed when it was lost; its traceback, if it printed one, ends its stderr.
            self._log.error("worker.exited", pid=worker.pid, status=status, stderr=await worker.last_words())
            return reason
        if session.refused is None:
            # It died before it could say why (a crash while loading): what it printed is the reason.
            reason = f"{reason} ({status}) before it was ready; {await worker.printed()}"
            # A spare that died idle says nothing of the model: the next start is a fresh worker's.
            self._spare_lost = worker.spare
        self._log.error("worker.exited", pid=worker.pid, status=status, stderr=worker.stderr.text())
        await self._lose(reason)
        return reason

    def _spawned(self, pid: int) -> None:
        self._pid = pid

    def _on_ready(self, message: Any, worker: WorkerProcess, ready: Callable[[], None]) -> None:
        self._kind.on_ready(message)
        first, self._started = not self._started, True
        self.state = WorkerState.READY
        if not self._counted:
            _SERVING.count, self._counted = _SERVING.count + 1, True
        self._ready.set()
        start_s = round(time.monotonic() - self._starting_at, 3)
        self._log.info("worker.ready", pid=message.pid, restarts=self._restarts, spare=worker.spare, start_s=start_s)
        # The next start's spare imports now, nicer, once this worker no longer competes for the CPU.
        SPARES.refill(self._group, mode=self._settings.worker_spare, connect_timeout=self._connect_timeout)
        if first:
            ready()

    async def _watch(self, session: S, lose: Callable[[str], None], scope: anyio.CancelScope) -> None:
        """A worker silent past the heartbeat bound while the front waits on it is hung: it is killed."""
        pid = session.worker.pid
        while True:
            # A loading worker's beats come from its loop beside the threads that load the model, which hold the
            # interpreter lock for long stretches (and it runs nicer beside other workers): it has a longer bound.
            beat_bound = self._settings.worker_heartbeat_timeout
            bound = beat_bound * (1 if session.ready else _LOADING_BOUND_FACTOR)
            # Wakes at the earliest moment the worker could be past the bound, not on a short poll:
            # a healthy worker's frames keep moving that moment on, so an idle front wakes about once a bound.
            silent = session.silent_s()
            if silent > bound:
                lose(f"the worker (pid {pid}) sent no heartbeat for {bound:g} s")
                self._log.error("worker.hung", pid=pid, bound_s=bound)
                session.worker.kill()
                scope.cancel()
                return
            # At most one beat bound: a worker that becomes ready meanwhile is held to it from then on.
            await anyio.sleep(min(bound - silent, beat_bound) + _WATCH_SLACK_S)

    async def _lose(self, reason: str) -> None:
        """Everything the lost worker held fails now."""
        session, self._session = self._session, None
        self._log.error("worker.lost", reason=reason, **self._kind.held(session))
        self.state, self._ready = WorkerState.RESTARTING, anyio.Event()
        await self._kind.fail(session, worker_lost(reason))
