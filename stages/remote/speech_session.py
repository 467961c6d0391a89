"""One live connection to a speech model's worker: its frames both ways, the transcriptions it holds, its beats.

The speech counterpart of `stages/remote/session.py`'s `WorkerSession`, over the same connection
(`stages/remote/connection.py`), for a worker that serves Whisper (`workers/speech_host.py`): it lives from the
worker's start to its end; the supervisor (stages/remote/supervisor.py) starts one per worker, as `RemoteSpeech`
(stages/remote/speech_gateway.py) makes it. It owns what dies with the connection: the outbox of frames queued for
the worker (`SpeechSettingsIn` first), the transcriptions sent to it and not yet answered, which fail with 503
`worker_lost` when it is lost (`fail`), and the last heartbeat's queue figures.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import attrs
from anyio.abc import TaskGroup

from pipeline.errors import RequestError
from stages.model_thread.exclusive import ExclusiveStatistics
from stages.remote.connection import WorkerConnection
from stages.remote.convert import error_out
from stages.remote.crossing import BeatOut, CancelIn, RefusedOut
from stages.remote.speech_crossing import (
    SpeechReadyOut,
    ToSpeechFront,
    TranscribeIn,
    TranscriptOut,
)


@attrs.define(eq=False)
class _Job:
    done: anyio.Event = attrs.field(factory=anyio.Event)
    out: TranscriptOut | None = None


@attrs.define(eq=False, kw_only=True)
class SpeechSession(WorkerConnection):
    incoming: ClassVar[Any] = ToSpeechFront
    outbox_name: ClassVar[str] = "speech-worker"

    exclusive: ExclusiveStatistics | None = attrs.field(default=None, init=False)
    # Transcriptions sent to this worker and not yet answered.
    _jobs: dict[int, _Job] = attrs.field(factory=dict, init=False)

    @property
    def holding(self) -> int:
        return len(self._jobs)

    async def transcribe(self, job: TranscribeIn) -> TranscriptOut | None:
        """Send `job` and wait for its answer; None when it could not be sent (not ready, gone, outbox full).

        A caller cancelled meanwhile (its client left) cancels the job in the worker.
        """
        pending = self._jobs[job.job_id] = _Job()
        if not self.send(job):
            del self._jobs[job.job_id]
            return None
        try:
            await pending.done.wait()
        except BaseException:
            if not pending.done.is_set():
                self.send(CancelIn(job_id=job.job_id))
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

    async def _handle(self, message: ToSpeechFront, group: TaskGroup) -> bool:
        # The front ends a speech worker by cancelling the read, never by waiting for its end: an end is a loss.
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
                return self._refuse(message.reason)
        return True
