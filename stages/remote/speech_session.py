"""One live connection to a speech model's worker: its frames both ways, the transcriptions it holds, its beats.

The speech counterpart of `stages/remote/session.py`'s `WorkerSession`, for a worker that serves Whisper
(`workers/speech_host.py`): it lives from the worker's start to its end; the supervisor (stages/remote/supervisor.py)
starts one per worker, as `RemoteSpeech` (stages/remote/speech_gateway.py) makes it. It owns what dies with
the connection: the outbox of frames queued for the worker (`SpeechSettingsIn` first), the transcriptions sent to
it and not yet answered, which fail with 503 `worker_lost` when it is lost (`fail`), and the last heartbeat's
queue figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import attrs
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from pipeline.channels import Channel, open_channel
from pipeline.errors import RequestError
from stages.model_thread.exclusive import ExclusiveStatistics
from stages.remote.convert import error_out
from stages.remote.crossing import BeatOut, CancelIn, RefusedOut
from stages.remote.frames import FrameError, FrameReader, FrameWriter
from stages.remote.process import WorkerProcess
from stages.remote.speech_crossing import (
    SpeechReadyOut,
    SpeechSettingsIn,
    ToSpeechFront,
    ToSpeechWorker,
    TranscribeIn,
    TranscriptOut,
)

log = structlog.get_logger(stage="remote")


@attrs.define(eq=False)
class _Job:
    done: anyio.Event = attrs.field(factory=anyio.Event)
    out: TranscriptOut | None = None


@attrs.define(eq=False)
class SpeechSession:
    worker: WorkerProcess
    # Frames the front may have queued for the worker: a job and its cancel per transcription admitted.
    _capacity: int = attrs.field(alias="capacity")
    # Told of the worker's `SpeechReadyOut` (the supervisor's state, its start's log, the engine's start).
    _on_ready: Callable[[SpeechReadyOut], None] = attrs.field(alias="on_ready")
    # Told why the worker is lost (its end, a bad frame, its refusal); the supervisor keeps the first.
    _lose: Callable[[str], None] = attrs.field(alias="lose")
    refused: str | None = attrs.field(default=None, init=False)
    # It answered a transcription: its loss does not count towards the restarts in a row that fail the model.
    served: bool = attrs.field(default=False, init=False)
    ready: bool = attrs.field(default=False, init=False)
    exclusive: ExclusiveStatistics | None = attrs.field(default=None, init=False)
    _outbox: Channel[ToSpeechWorker] | None = attrs.field(default=None, init=False)
    # Transcriptions sent to this worker and not yet answered.
    _jobs: dict[int, _Job] = attrs.field(factory=dict, init=False)
    _last_frame: float = attrs.field(factory=time.monotonic, init=False)
    _reading_since: float | None = attrs.field(default=None, init=False)

    @property
    def holding(self) -> int:
        return len(self._jobs)

    def silent_s(self) -> float:
        """How long the worker has kept the front waiting on its next frame (0 while the front is not waiting)."""
        since = self._reading_since
        return time.monotonic() - max(since, self._last_frame) if since is not None else 0.0

    async def run(self, first: SpeechSettingsIn) -> None:
        """Send `first`, then serve frames until the worker ends or is lost; what is queued for it dies with it."""
        self._outbox = open_channel(self._capacity, name="speech-worker")
        try:
            self._outbox.send.send_nowait(first)
            self._last_frame = time.monotonic()
            async with anyio.create_task_group() as group:
                group.start_soon(self._write, self._outbox.receive)
                await self._read()
                group.cancel_scope.cancel()
        finally:
            self._outbox.send.close()
            self._outbox.receive.close()
            self._outbox = None

    async def transcribe(self, job: TranscribeIn) -> TranscriptOut | None:
        """Send `job` and wait for its answer; None when it could not be sent (not ready, gone, outbox full).

        A caller cancelled meanwhile (its client left) cancels the job in the worker.
        """
        pending = self._jobs[job.job_id] = _Job()
        if not self._send(job):
            del self._jobs[job.job_id]
            return None
        try:
            await pending.done.wait()
        except BaseException:
            if not pending.done.is_set():
                self._send(CancelIn(job_id=job.job_id))
            raise
        finally:
            self._jobs.pop(job.job_id, None)
        return pending.out

    def fail(self, error: RequestError) -> int:
        """Every transcription this worker held fails with `error`; how many did."""
        jobs, self._jobs = self._jobs, {}
        for job_id, job in jobs.items():
            job.out = TranscriptOut(job_id=job_id, error=error_out(error))
            job.done.set()
        return len(jobs)

    def _send(self, message: ToSpeechWorker) -> bool:
        if self._outbox is None or not self.ready:
            return False
        try:
            self._outbox.send.send_nowait(message)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    async def _read(self) -> None:
        reader: FrameReader[ToSpeechFront] = FrameReader(self.worker.stream, ToSpeechFront)
        pid = self.worker.pid
        while True:
            self._reading_since = time.monotonic()
            try:
                message = await reader.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, FrameError, OSError) as error:
                # The front ends a speech worker by cancelling this read, never by waiting for its end: an end
                # seen here is a loss.
                self._lose(f"the worker (pid {pid}) exited" if not isinstance(error, FrameError) else str(error))
                return
            finally:
                self._reading_since = None
            self._last_frame = time.monotonic()
            if not self._handle(message):
                return

    def _handle(self, message: ToSpeechFront) -> bool:
        """Act on one frame from the worker; False when the session ends with it."""
        match message:
            case TranscriptOut():
                if (job := self._jobs.get(message.job_id)) is not None:
                    self.served = True
                    job.out = message
                    job.done.set()
            case BeatOut():
                self.exclusive = message.exclusive
            case SpeechReadyOut():
                self.ready = True
                self._on_ready(message)
            case RefusedOut():
                self.refused = message.reason
                log.error("worker.refused", pid=self.worker.pid, reason=message.reason)
                self._lose(f"the worker (pid {self.worker.pid}) refused to start: {message.reason}")
                return False
        return True

    async def _write(self, outbox: MemoryObjectReceiveStream[ToSpeechWorker]) -> None:
        writer = FrameWriter(self.worker.stream)
        async for message in outbox:
            try:
                await writer.send(message)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the reader sees the worker go
