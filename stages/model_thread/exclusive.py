"""Exclusive model work: jobs the gateway's model thread runs between two decode steps.

Embeddings and scores need the model, and MLX runs on one thread (docs/STYLE.md, "One model thread"), so
they cannot run beside generation: they are queued here and the gateway
calls `between_steps` once per loop, after taking its intake. While rows
are decoding, exclusive work gets `share` of the decode time (a job runs
in chunks sized from its measured speed, so a large batch spreads over
many steps and running streams slow by about `share` on average); with
no rows it runs for `idle_turn` seconds (a step's time budget) and returns,
so the gateway looks at its intake between two chunks: a row that arrives
while a long job runs on an idle server waits for one chunk, not the job.

Why a period: a forward pass costs about as much as a decode step
whatever few tokens it carries (it reads every weight once), so a little
work after every step would lengthen every gap by most of a step. Spent
every `period` steps (default 100), the same share makes one gap in 100
longer and leaves the p95 gap alone. A turn disturbs about two gaps, its
own and the first step after it, so one turn in 50 steps still moved the
clients' p95 by a fifth on a quiet 2-core machine; one in 100 moved it by
3–10% at the same embedding throughput (docs/benchmarks.md, "Embeddings beside running
streams"). The cost is that one longer gap: `share × period` steps' worth.

Event loop side: `submit` takes an admission ticket (its own bound: 429
when full, 503 while draining), queues the job, wakes an idle gateway and
waits. A client that leaves marks its job cancelled; the thread skips it.
Model-thread side: `between_steps` runs chunks, isolates each job's
failure to that job, and returns the finished ones, which cross to the
loop with the step's parcel (`deliver` there wakes their requests).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast

import anyio
import attrs
import structlog

from pipeline.actor import isolated
from pipeline.admission import Admission, AdmissionStatistics
from pipeline.channels import ReplySlot
from pipeline.errors import RequestError, engine_dead, shutting_down
from pipeline.settings import Settings

log = structlog.get_logger(stage="exclusive")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
# A first guess at seconds per unit (a token of a forward pass) before anything ran: on the slow side,
# so a first chunk stays short.
_FIRST_RATE = 1e-3
# Seconds taken as a decode step's length until one has been measured.
_FIRST_STEP = 0.02
# Upper bounds (ms) of the step-gap histogram's buckets.
_GAP_BOUNDS_MS = (
    1,
    2,
    3,
    4,
    5,
    6,
    8,
    10,
    12,
    14,
    16,
    18,
    20,
    23,
    26,
    30,
    35,
    40,
    50,
    60,
    75,
    100,
    150,
    200,
    300,
    500,
    1000,
    float("inf"),
)
# Each measurement's weight in the running speed estimate.
_SMOOTHING = 0.3


class Work(Protocol[T_co]):
    """Model work that can run in chunks; every method runs on the model thread."""

    def remaining(self) -> int:
        """Units (tokens through the model) still to run; 0 once done."""
        ...

    def run_chunk(self, model: Any, max_units: int) -> int:
        """Run about `max_units` of the work (at least one item, whatever its size); the units run."""
        ...

    def result(self) -> T_co: ...


@attrs.define(eq=False)
class Job(Generic[T]):
    work: Work[T]
    kind: str
    log_context: dict[str, str]
    # Jobs of one model share a speed estimate; another model's tokens cost differently.
    rate_key: str = ""
    done: anyio.Event = attrs.field(factory=anyio.Event)
    queued_at: float = attrs.field(factory=time.monotonic)
    started_at: float | None = None
    # Set by the event loop when the client leaves; read by the model thread.
    cancelled: bool = False
    error: RequestError | None = None


# Runs one chunk of a job's work with the model, `units` of it; the units run.
ChunkRunner = Callable[[Job[Any], Any, int], int]


@attrs.frozen(kw_only=True)
class ExclusiveStatistics:
    admission: AdmissionStatistics
    queued: int
    finished: int
    chunks: int
    # Seconds the model thread spent on exclusive work.
    busy_seconds: float
    # How long the model thread's loop took per decode step while rows ran (what a stream sees
    # between two tokens), counted by upper bound in ms ("le_20": at most 20 ms): bench/embeddings.py
    # compares two snapshots' difference.
    step_gaps: dict[str, int]


@attrs.define
class ExclusiveQueue:
    _admission: Admission = attrs.field(alias="admission")
    # The share of decode time exclusive work may add while rows run, spent at most
    # once every `period` steps: one longer gap instead of every gap a little longer.
    _share: float = attrs.field(alias="share")
    _period: int = attrs.field(default=1, alias="period")
    # Seconds of work per call while no row runs: the gateway takes its intake between two such turns.
    _idle_turn: float = attrs.field(default=0.2, alias="idle_turn")
    _queue: collections.deque[Job[Any]] = attrs.field(factory=collections.deque, init=False)
    _runner: ChunkRunner = attrs.field(default=lambda job, model, units: job.work.run_chunk(model, units), init=False)
    # Wakes an idle model thread (the gateway's handoff binds it).
    _wake: Callable[[], None] = attrs.field(default=lambda: None, init=False)
    _stopped: RequestError | None = attrs.field(default=None, init=False)
    # Touched only by the model thread.
    _rates: dict[str, float] = attrs.field(factory=dict, init=False)
    _last_return: float | None = attrs.field(default=None, init=False)
    _was_busy: bool = attrs.field(default=False, init=False)
    _step: float | None = attrs.field(default=None, init=False)
    # Seconds of model time earned and not yet spent (negative: a chunk overran it); steps since the last spend.
    _credit: float = attrs.field(default=0.0, init=False)
    _since: int = attrs.field(default=0, init=False)
    _last_began: float | None = attrs.field(default=None, init=False)
    _gaps: list[int] = attrs.field(factory=lambda: [0] * len(_GAP_BOUNDS_MS), init=False)
    _finished: int = attrs.field(default=0, init=False)
    _chunks: int = attrs.field(default=0, init=False)
    _busy: float = attrs.field(default=0.0, init=False)

    @classmethod
    def of(cls, settings: Settings) -> ExclusiveQueue:
        admission = Admission(
            capacity=settings.exclusive_pending, timeout=settings.admission_timeout, retry_after=settings.retry_after
        )
        return cls(
            admission=admission,
            share=settings.exclusive_share,
            period=settings.exclusive_period,
            idle_turn=settings.step_budget_ms / 1000,
        )

    # -- event loop ---------------------------------------------------------

    async def submit(self, work: Work[T], *, kind: str, request_id: str, trace_id: str, rate_key: str = "") -> T:
        """Run `work` on the model thread between steps; its result.

        Raises:
            RequestError: 429 when the queue stays full, 503 while draining or
                once the engine stopped, or the work's own refusal.
        """
        if self._stopped is not None:
            raise self._stopped
        await self._admission.enter()
        try:
            job = Job(
                work=work, kind=kind, log_context={"request_id": request_id, "trace_id": trace_id}, rate_key=rate_key
            )
            self._queue.append(job)
            self._wake()
            try:
                await job.done.wait()
            except BaseException:
                job.cancelled = True
                raise
            if job.error is not None:
                raise job.error
            return job.work.result()
        finally:
            self._admission.leave()

    def queue_unawaited(self, work: Work[Any], *, kind: str) -> None:
        """Queue work no request waits for (loading a side model at start-up): it takes no admission ticket."""
        self._queue.append(Job(work=work, kind=kind, log_context={"request_id": "startup", "trace_id": "startup"}))
        self._wake()

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def wake_with(self, wake: Callable[[], None]) -> None:
        """Call `wake` (on the loop) whenever a job is queued: an idle model thread then runs it."""
        self._wake = wake

    def run_chunks_with(self, runner: ChunkRunner) -> None:
        """Run each chunk through `runner` (a sharded model: every rank runs it, stages/shard/work.py)."""
        self._runner = runner

    def start_draining(self) -> None:
        self._admission.start_draining()

    def stop(self, dead: bool) -> None:
        """The model thread has ended: every job still queued fails, and so does any later one."""
        self._stopped = engine_dead() if dead else shutting_down()
        while self._queue:
            job = self._queue.popleft()
            job.error = self._stopped
            job.done.set()

    def statistics(self) -> ExclusiveStatistics:
        return ExclusiveStatistics(
            admission=self._admission.statistics(),
            queued=len(self._queue),
            finished=self._finished,
            chunks=self._chunks,
            busy_seconds=round(self._busy, 6),
            step_gaps={f"le_{bound:g}": count for bound, count in zip(_GAP_BOUNDS_MS, self._gaps)},
        )

    # -- model thread -------------------------------------------------------

    def between_steps(self, model: Any, *, busy: bool) -> list[Job[Any]]:
        """Run queued work: while rows run (`busy`), the time it has earned; else `idle_turn` seconds of it.

        Returns the jobs it finished, for the loop's `deliver` (they cross with the step's parcel).
        """
        began = time.monotonic()
        if busy and self._was_busy and self._last_began is not None:
            gap = (began - self._last_began) * 1000
            self._gaps[next(i for i, bound in enumerate(_GAP_BOUNDS_MS) if gap <= bound)] += 1
        self._last_began = began
        step = self._step_time(began)
        if not self._queue:
            self._credit, self._since = 0.0, 0
            self._last_return, self._was_busy = began, busy
            return []
        if busy:
            # Each step earns `share` of its length; it is spent every `period` steps at most.
            self._credit = min(self._credit + self._share * step, self._share * step * self._period)
            self._since += 1
            if self._since < self._period or self._credit <= 0.0:
                self._last_return, self._was_busy = began, busy
                return []
        budget = self._credit if busy else self._idle_turn
        done: list[Job[Any]] = []
        spent = 0.0
        while self._queue and (spent == 0.0 or spent < budget):
            job = self._queue[0]
            if job.cancelled or self._run_chunk(job, model, budget - spent):
                done.append(self._queue.popleft())
            spent = time.monotonic() - began
        self._busy += spent
        self._credit, self._since = (self._credit - spent if busy else 0.0), 0
        self._last_return, self._was_busy = time.monotonic(), busy
        return done

    def _step_time(self, now: float) -> float:
        """A decode step's usual length: the time since the last call, when rows ran through it."""
        if self._last_return is not None and self._was_busy:
            measured = now - self._last_return
            self._step = measured if self._step is None else (1 - _SMOOTHING) * self._step + _SMOOTHING * measured
        # Before any busy step was seen: a small slice, not the idle wait's length.
        return self._step if self._step is not None else _FIRST_STEP

    def _run_chunk(self, job: Job[Any], model: Any, budget: float) -> bool:
        """One chunk of `job`; True once it is finished (or failed)."""
        if job.started_at is None:
            job.started_at = time.monotonic()
        rate = self._rates.get(job.rate_key, _FIRST_RATE)
        units = max(1, int(budget / rate))
        began = time.monotonic()
        ran = 0
        with isolated(
            cast("ReplySlot[Any]", _Failing(job)), stage="exclusive", fail=lambda error: setattr(job, "error", error)
        ):
            ran = self._runner(job, model, units)
        self._chunks += 1
        if ran > 0:
            measured = (time.monotonic() - began) / ran
            self._rates[job.rate_key] = (1 - _SMOOTHING) * rate + _SMOOTHING * measured
        return job.error is not None or job.work.remaining() == 0

    # -- event loop, again --------------------------------------------------

    def deliver(self, jobs: Sequence[Job[Any]]) -> None:
        """Finish the jobs `between_steps` returned: log them and wake their requests."""
        now = time.monotonic()
        for job in jobs:
            started = job.started_at if job.started_at is not None else now
            context = job.log_context
            log.info("request.queue", **context, kind=job.kind, duration_s=round(started - job.queued_at, 6))
            outcome = "cancelled" if job.cancelled else ("failed" if job.error is not None else "ok")
            log.info(f"request.{job.kind}", **context, duration_s=round(now - started, 6), outcome=outcome)
            self._finished += 1
            job.done.set()


@attrs.define
class _Failing:
    """What `isolated` needs of a reply: where to log, and the failure goes to the job."""

    _job: Job[Any]

    @property
    def log_context(self) -> dict[str, str]:
        return self._job.log_context

    def fail(self, error: RequestError) -> bool:
        self._job.error = error
        return True
