"""The worker's side of the crossing: the model's gateway, served to the front over one socket.

The gateway runs here as it runs in-process (`stages/engine/model_side.py`): its
model thread, handoff, KV scheduler, prompt cache and exclusive queue are
unchanged. This host only translates: frames from the front become
`Prepared` rows, aborts and jobs on the gateway's channels, and each
`StepOutputs` the gateway hands over becomes one `StepOut` frame.
Back-pressure: each frame is written by the task that made it, one at a
time under a lock (a step's frame goes out from the pump without a hop
through another task); a front that stops reading fills the socket, the
pump waits on it, then the gateway's step channel fills, and the model
thread waits (`steps_ahead`).
A front that goes away (end of stream) ends the worker.
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
import attrs
import numpy as np
import structlog
from anyio.abc import ByteStream, TaskGroup

from pipeline.channels import Channel, ReplySlot, open_channel
from pipeline.errors import RequestError, reason_of
from pipeline.requests import Accepted
from pipeline.settings import Settings
from pipeline.yielding import yielding_gil
from stages.engine.model_side import make_gateway
from stages.messages import Abort, CompiledConstraint, Grammar, Prepared, StepOutputs
from stages.model_thread.embed import EmbedWork, ScoreWork
from stages.model_thread.gateway import GenerationGateway
from stages.remote.convert import error_out, prepared_of, step_out
from stages.remote.crossing import (
    AbortIn,
    BeatOut,
    CancelIn,
    CloseIn,
    FailedOut,
    JobIn,
    JobOut,
    ReadyOut,
    RefusedOut,
    RowIn,
    StartIn,
    StatsIn,
    ToFront,
    ToWorker,
)
from stages.remote.frames import FrameReader
from workers.beats import Beats
from workers.frames_out import FramesOut
from workers.model import WorkerModel, open_model
from workers.priority import restore

log = structlog.get_logger(stage="worker")

# Steps handed over and not yet framed (the in-process engine's step buffer).
_STEP_BUFFER = 4


@attrs.frozen(kw_only=True)
class StartTimes:
    """Seconds of a worker's start, by phase, as `worker.ready` logs them."""

    # Importing mlx, mlx-lm (and transformers through it) and this code.
    imports_s: float
    # Connecting to the front.
    connect_s: float
    # Waiting for the front's settings: a spare's idle time (stages/remote/spare.py), else about nothing.
    waited_s: float = 0.0
    # The tokenizer, the disk tier and a dedicated embedding model (`workers/model.py`); the plan is the front's.
    open_s: float = 0.0
    # The weights onto the model thread, the prompt cache, and the generator made (the gateway's start).
    load_s: float = 0.0


@attrs.define(eq=False)
class _WorkerReply(ReplySlot[Accepted]):
    """A row's reply in the worker: nothing reads it but a failure, which crosses to the front."""

    _failures: list[FailedOut] = attrs.field(factory=list, kw_only=True, alias="failures")
    _failed: anyio.Event | None = attrs.field(default=None, kw_only=True, alias="failed")

    def fail(self, error: RequestError) -> bool:
        failed = super().fail(error)
        if failed:
            self._failures.append(FailedOut(request_id=self.request_id, error=error_out(error)))
            if self._failed is not None:
                self._failed.set()
        return failed


@attrs.define
class WorkerHost:
    settings: Settings
    beat_interval: float
    # What the front decided at its start (stages/remote/crossing.py): the model side is built from it.
    start: StartIn
    # The nice value to serve at once loaded (workers/priority.py); None: it was never changed.
    base_nice: int | None = None
    times: StartTimes = attrs.field(factory=lambda: StartTimes(imports_s=0.0, connect_s=0.0))
    _frames: FramesOut | None = attrs.field(default=None, init=False)
    _failures: list[FailedOut] = attrs.field(factory=list, init=False)
    _failed: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _jobs: dict[int, anyio.CancelScope] = attrs.field(factory=dict, init=False)
    # Rows' replies while their rows live: an abort must close the reply of a row still in the gateway's
    # inbox (a full batch), which the gateway then skips, as the front's closed reply is skipped in process.
    _replies: weakref.WeakValueDictionary[str, _WorkerReply] = attrs.field(
        factory=weakref.WeakValueDictionary, init=False
    )
    _gateway: GenerationGateway | None = attrs.field(default=None, init=False)
    _model: WorkerModel | None = attrs.field(default=None, init=False)
    # The heartbeat and the failure flush: they end once the last step is framed.
    _helpers: list[anyio.CancelScope] = attrs.field(factory=list, init=False)
    _beats: Beats = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._beats = Beats(interval=self.beat_interval, holding=self._holding, beat=self._heartbeat)

    async def serve(self, stream: ByteStream, reader: FrameReader[ToWorker]) -> None:
        async with anyio.create_task_group() as group:
            frames = self._frames = FramesOut(stream)
            group.start_soon(self._helper, functools.partial(self._beats.run, frames))
            settings, in_flight = self.settings, self.settings.max_batch + self.settings.max_pending
            inbox: Channel[Prepared] = open_channel(in_flight, name="gateway")
            control: Channel[Abort] = open_channel(settings.max_batch, name="control")
            steps: Channel[StepOutputs] = open_channel(_STEP_BUFFER, name="steps")
            try:
                # The heartbeats keep their turn beside the loading threads (pipeline/yielding.py says why).
                with yielding_gil():
                    opened = time.perf_counter()
                    model = self._model = await open_model(self.settings, self.start)
                    loaded = time.perf_counter()
                    self._gateway = make_gateway(model.side, inbox.receive, control, steps.send)
                    # Each step's frame goes out from the model thread (workers/frames_out.py); rows that fail
                    # on the loop cross in the failure flush's frames.
                    self._gateway.send_steps_with(lambda outputs: frames.send_from_thread(step_out(outputs, [])))
                    await group.start(self._gateway.run)
                times = attrs.evolve(self.times, open_s=loaded - opened, load_s=time.perf_counter() - loaded)
            except Exception as error:
                # The front hears why before the process ends (its own log then has the traceback).
                await self._send(RefusedOut(reason=reason_of(error)))
                raise
            restore(self.base_nice)
            group.start_soon(self._pump, steps)
            group.start_soon(self._helper, self._flush_failures)
            await self._send(ReadyOut(pid=os.getpid()))
            log.info(
                "worker.ready",
                pid=os.getpid(),
                model=model.side.info.name,
                **{key: round(value, 3) for key, value in attrs.asdict(times).items()},
            )
            ended = await self._read(reader, inbox, control, group)
            if not ended:
                # The front went away: nothing is left to serve.
                group.cancel_scope.cancel()

    async def _read(
        self, reader: FrameReader[ToWorker], inbox: Channel[Prepared], control: Channel[Abort], group: TaskGroup
    ) -> bool:
        """Frames from the front until it closes (False) or drains this worker (True)."""
        while True:
            try:
                message = await reader.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return False
            if isinstance(message, RowIn):
                await inbox.send.send(await self._prepared(message))
            elif isinstance(message, AbortIn):
                if (reply := self._replies.get(message.request_id)) is not None:
                    reply.close()
                await control.send.send(Abort(request_id=message.request_id))
            elif isinstance(message, JobIn):
                scope = self._jobs[message.job_id] = anyio.CancelScope()
                self._beats.wake()
                group.start_soon(self._run_job, message, scope)
            elif isinstance(message, CancelIn):
                if (running := self._jobs.get(message.job_id)) is not None:
                    running.cancel()
            elif isinstance(message, StatsIn):
                await self._send(self._heartbeat())
            elif isinstance(message, CloseIn):
                inbox.send.close()
                return True

    async def _prepared(self, row: RowIn) -> Prepared:
        assert self._model is not None
        reply = _WorkerReply(row.request_id, row.trace_id, failures=self._failures, failed=self._failed)
        self._replies[row.request_id] = reply
        self._beats.wake()
        constraint: CompiledConstraint | None = None
        if row.grammar is not None:
            grammar = Grammar(text=row.grammar, param=row.grammar_param)
            try:
                constraint = await anyio.to_thread.run_sync(self._model.compiler.compile_grammar, grammar)
            except RequestError as error:
                reply.fail(error)
        return prepared_of(row, reply, constraint)

    async def _pump(self, steps: Channel[StepOutputs]) -> None:
        async with steps.receive:
            async for outputs in steps.receive:
                await self._send(step_out(outputs, self._take_failures()))
        await self._send(
            step_out(StepOutputs(admitted=(), deltas=(), stepped_at=time.monotonic()), self._take_failures())
        )
        for helper in self._helpers:
            helper.cancel()

    async def _helper(self, task: Callable[[], Awaitable[None]]) -> None:
        with anyio.CancelScope() as scope:
            self._helpers.append(scope)
            await task()

    def _take_failures(self) -> list[FailedOut]:
        failures = list(self._failures)
        self._failures.clear()
        return failures

    async def _flush_failures(self) -> None:
        """Rows that failed in a step that produced no outputs still cross at once."""
        while True:
            await self._failed.wait()
            self._failed = anyio.Event()
            if self._failures:
                empty = StepOutputs(admitted=(), deltas=(), stepped_at=time.monotonic())
                await self._send(step_out(empty, self._take_failures()))

    async def _run_job(self, job: JobIn, scope: anyio.CancelScope) -> None:
        model = self._model
        assert model is not None
        side = model.embedder if job.side else None
        work: Any = (
            EmbedWork(inputs=job.inputs, pooling=job.pooling, dimensions=job.dimensions, side=side)
            if job.kind == "embed"
            else ScoreWork(inputs=job.inputs, yes=job.yes, no=job.no, side=side)
        )
        out: JobOut | None = None
        with scope:
            try:
                result = await model.side.exclusive.submit(
                    work, kind=job.kind, request_id=job.request_id, trace_id=job.trace_id, rate_key=job.rate_key
                )
                out = _job_out(job.job_id, job.kind, result)
            except RequestError as error:
                out = JobOut(job_id=job.job_id, error=error_out(error))
        del self._jobs[job.job_id]
        if out is not None:
            await self._send(out)

    def _heartbeat(self) -> BeatOut:
        gateway, model = self._gateway, self._model
        return BeatOut(
            gateway=gateway.statistics() if gateway is not None else None,
            prompt_cache=gateway.cache_statistics() if gateway is not None else None,
            exclusive=model.side.exclusive.statistics() if model is not None else None,
        )

    def _holding(self) -> bool:
        """Loading, or a row or job in hand: the front may be waiting on this worker."""
        return self._gateway is None or bool(self._replies) or bool(self._jobs)

    async def _send(self, message: ToFront) -> None:
        assert self._frames is not None
        await self._frames.send(message)


def _job_out(job_id: int, kind: str, result: Any) -> JobOut:
    if kind == "embed":
        return JobOut(job_id=job_id, vectors=[np.asarray(vector, dtype=np.float32).tobytes() for vector in result])
    return JobOut(job_id=job_id, scores=[float(score) for score in result])
