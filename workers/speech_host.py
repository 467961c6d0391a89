"""The worker's side of a speech model: Whisper on its thread, served to the front over one socket.

workers/main.py hands the connection here when the front's first frame is `SpeechSettingsIn`
(stages/remote/speech_crossing.py). The model runs on the same `SpeechThread` that runs it in the HTTP process
under `--in-process` (stages/engine/speech_thread.py): loaded on its own thread, transcriptions queued to it one
at a time, each file's audio decoded here by libsndfile before its job queues, so a decoder or a model that
crashes takes down this process alone and the front restarts it. This host only translates: a `TranscribeIn`
becomes a call of the thread's `transcribe` in a cancel scope (a `CancelIn` cancels it: a queued job is dropped
unrun), and its transcript or error goes back as a `TranscriptOut`. Beats as a chat worker's (workers/beats.py):
every `beat_interval` while it loads or holds a job, every fourth while idle, at once when a job arrives. A model
thread that failed (the engine dead) ends the worker, so the front starts a fresh one rather than keep a worker
that answers every job with 503. A front that goes away (end of stream) ends the worker.
"""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
import attrs
import structlog
from anyio.abc import ByteStream, TaskGroup, TaskStatus

from pipeline.errors import RequestError, internal_error, reason_of
from pipeline.settings import Settings
from pipeline.yielding import yielding_gil
from stages.engine.speech_thread import SpeechThread
from stages.models.whisper import SpeechInfo
from stages.remote.convert import error_out
from stages.remote.crossing import BeatOut, CancelIn, RefusedOut, StatsIn
from stages.remote.frames import FrameReader
from stages.remote.speech_crossing import SpeechReadyOut, ToSpeechFront, TranscribeIn, TranscriptOut
from workers.beats import Beats
from workers.frames_out import FramesOut
from workers.host import StartTimes
from workers.priority import restore

log = structlog.get_logger(stage="worker")


class SpeechThreadFailed(RuntimeError):
    """The speech model's thread ended on an error that was not one job's: the worker ends, the front restarts it."""


@attrs.define
class SpeechHost:
    settings: Settings
    info: SpeechInfo
    beat_interval: float
    # The nice value to serve at once loaded (workers/priority.py); None: it was never changed.
    base_nice: int | None = None
    times: StartTimes = attrs.field(factory=lambda: StartTimes(imports_s=0.0, connect_s=0.0))
    _engine: SpeechThread = attrs.field(init=False)
    _frames: FramesOut | None = attrs.field(default=None, init=False)
    _jobs: dict[int, anyio.CancelScope] = attrs.field(factory=dict, init=False)
    _loaded: bool = attrs.field(default=False, init=False)
    _beats: Beats = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        # The front's admission bounds what it sends; a job it cancels frees the front's ticket before this queue
        # hears of it, so this queue's bound has room for those too and never refuses what the front admitted.
        settings = attrs.evolve(self.settings, exclusive_pending=2 * self.settings.exclusive_pending)
        self._engine = SpeechThread.of(settings, self.info)
        self._beats = Beats(interval=self.beat_interval, holding=self._holding, beat=self._checked_heartbeat)

    async def serve(self, stream: ByteStream, reader: FrameReader[Any]) -> None:
        async with anyio.create_task_group() as group:
            frames = self._frames = FramesOut(stream)
            group.start_soon(self._beats.run, frames)
            try:
                # The heartbeats keep their turn beside the loading thread (pipeline/yielding.py says why).
                with yielding_gil():
                    opened = time.perf_counter()
                    await group.start(self._run_engine)
                times = attrs.evolve(self.times, load_s=time.perf_counter() - opened)
            except Exception as error:
                # The front hears why before the process ends (its own log then has the traceback).
                await self._send(RefusedOut(reason=reason_of(error)))
                raise
            self._loaded = True
            restore(self.base_nice)
            await self._send(SpeechReadyOut(pid=os.getpid(), languages=self._engine.languages()))
            rounded = {key: round(value, 3) for key, value in attrs.asdict(times).items()}
            log.info("worker.ready", pid=os.getpid(), model=self.info.name, **rounded)
            await self._read(reader, group)
            # The front went away: nothing is left to serve.
            group.cancel_scope.cancel()

    async def _run_engine(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self._engine.run(task_status.started)

    async def _read(self, reader: FrameReader[Any], group: TaskGroup) -> None:
        while True:
            try:
                message = await reader.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            match message:
                case TranscribeIn():
                    scope = self._jobs[message.job_id] = anyio.CancelScope()
                    self._beats.wake()
                    group.start_soon(self._run_job, message, scope)
                case CancelIn():
                    if (running := self._jobs.get(message.job_id)) is not None:
                        running.cancel()
                case StatsIn():
                    await self._send(self._heartbeat())

    async def _run_job(self, job: TranscribeIn, scope: anyio.CancelScope) -> None:
        out: TranscriptOut | None = None
        with scope:
            try:
                transcript = await self._engine.transcribe(
                    job.request, request_id=job.request_id, trace_id=job.trace_id
                )
                out = TranscriptOut(job_id=job.job_id, transcript=transcript)
            except RequestError as error:
                out = TranscriptOut(job_id=job.job_id, error=error_out(error))
            except Exception as error:  # our bug, met on this job's data: it fails this job alone
                log.error("request.internal_error", request_id=job.request_id, trace_id=job.trace_id, exc_info=error)
                out = TranscriptOut(job_id=job.job_id, error=error_out(internal_error()))
        del self._jobs[job.job_id]
        if out is not None:
            await self._send(out)

    def _heartbeat(self) -> BeatOut:
        return BeatOut(exclusive=self._engine.statistics())

    def _checked_heartbeat(self) -> BeatOut:
        """The beat, or `SpeechThreadFailed` once the model thread is dead: raised in the beats' task, it ends
        the worker."""
        if self._engine.dead:
            raise SpeechThreadFailed(f"the model thread of {self.info.name} failed; see the log above")
        return self._heartbeat()

    def _holding(self) -> bool:
        """Loading, or a job in hand: the front may be waiting on this worker."""
        return not self._loaded or bool(self._jobs)

    async def _send(self, message: ToSpeechFront) -> None:
        assert self._frames is not None
        await self._frames.send(message)
