"""The front's side of a speech model served from a worker process: admission here, Whisper over there.

`SpeechEngine` (stages/engine/speech.py) holds a `RemoteSpeech` where a chat model would run in a worker (the
default; not under `--in-process`). The front keeps what is cheap and per request: the language and size checks
(in the engine), the admission of the transcriptions (its own `Admission` with the in-process queue's bounds:
429 past `MLX_RELAY_EXCLUSIVE_PENDING` after `MLX_RELAY_ADMISSION_TIMEOUT`, 503 while draining) and the
statistics. Each admitted transcription crosses as its request (`TranscribeIn`, the audio file undecoded); the
worker (`workers/speech_host.py`) decodes it and runs it on its `SpeechThread`, and the `Transcript` or the job's
error comes back. A client that leaves cancels its job over there.

Supervision is the chat workers' (stages/remote/supervisor.py's `Supervisor`: the same policy and the same log
events, each carrying the model's name), for a worker that holds transcriptions rather than rows: this module is
that kind of worker (`SessionKind`). One connection is a `SpeechSession` (stages/remote/speech_session.py), its
first frame `SpeechSettingsIn`, and on a loss every transcription it held fails at once with 503 `worker_lost`
while one not yet sent waits for the next worker. A chat model's worker beside it is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import anyio
import attrs

from pipeline.admission import Admission
from pipeline.errors import RequestError, engine_dead, shutting_down
from pipeline.settings import Settings
from pipeline.transcripts import Transcript, TranscriptionRequest
from stages.model_thread.exclusive import ExclusiveStatistics
from stages.models.whisper import SpeechInfo
from stages.remote.convert import request_error
from stages.remote.process import WorkerProcess
from stages.remote.speech_crossing import SpeechReadyOut, SpeechSettingsIn, TranscribeIn, TranscriptOut
from stages.remote.speech_session import SpeechSession
from stages.remote.status import WorkerState, WorkerStatus
from stages.remote.supervisor import EXIT_GRACE_S, Supervisor

# How often a transcription that could not be queued (the outbox full, or the worker lost meanwhile) tries again.
_RETRY_S = 0.05


@attrs.define(eq=False)
class RemoteSpeech:
    _settings: Settings = attrs.field(alias="settings")
    info: SpeechInfo = attrs.field(alias="info")
    _connect_timeout: float = attrs.field(default=600.0, alias="connect_timeout")
    _admission: Admission = attrs.field(init=False)
    _supervisor: Supervisor[SpeechSession] = attrs.field(init=False)
    _next_job: int = attrs.field(default=0, init=False)
    # Whisper's languages, from the worker's ready answer (the engine starts only after one).
    _languages: dict[str, str] = attrs.field(factory=dict, init=False)
    # Why no transcription is taken any more: the model failed, or it was stopped (unloaded, the server's end).
    _stopped: RequestError | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        settings = self._settings
        self._admission = Admission(
            capacity=settings.exclusive_pending, timeout=settings.admission_timeout, retry_after=settings.retry_after
        )
        # Its worker is never drained through its socket: a cancelled one needs only to see the socket end.
        self._supervisor = Supervisor(
            kind=self,
            settings=settings,
            connect_timeout=self._connect_timeout,
            end_grace=EXIT_GRACE_S,
            log_fields={"model": self.info.name},
        )

    @property
    def running(self) -> bool:
        return self._supervisor.state is WorkerState.READY

    @property
    def dead(self) -> bool:
        """The model failed (refused, or too many restarts in a row): no worker will serve it again."""
        return self._supervisor.failed

    def status(self) -> WorkerStatus:
        return self._supervisor.status()

    def statistics(self) -> ExclusiveStatistics:
        """The front's admission, with the worker's queue figures from its last heartbeat (zeros before one)."""
        own = self._admission.statistics()
        session = self._supervisor.session
        remote = session.exclusive if session is not None else None
        if remote is None:
            return ExclusiveStatistics(admission=own, queued=0, finished=0, chunks=0, busy_seconds=0.0, step_gaps={})
        return attrs.evolve(remote, admission=own)

    def languages(self) -> dict[str, str]:
        """Whisper's languages by ISO-639-1 code, as the worker's `mlx_whisper` has them."""
        return self._languages

    def start_draining(self) -> None:
        self._admission.start_draining()

    async def transcribe(self, request: TranscriptionRequest, *, request_id: str, trace_id: str) -> Transcript:
        """The request's transcript, from the worker.

        Raises:
            RequestError: 429/503 from admission; 503 `worker_lost` when the worker holding it is lost, 503
                `engine_dead` once the model failed or `shutting_down` once it stopped; the worker's own refusal
                (a 400 naming `file`).
        """
        if self._stopped is not None:
            raise self._stopped
        await self._admission.enter()
        try:
            out = await self._run(request, request_id=request_id, trace_id=trace_id)
        finally:
            self._admission.leave()
        if out.error is not None:
            raise request_error(out.error)
        assert out.transcript is not None, "a transcript or an error"
        return out.transcript

    async def _run(self, request: TranscriptionRequest, *, request_id: str, trace_id: str) -> TranscriptOut:
        self._next_job += 1
        job = TranscribeIn(job_id=self._next_job, request=request, request_id=request_id, trace_id=trace_id)
        while True:
            await self._supervisor.wait_ready()
            if self._stopped is not None:
                raise self._stopped
            session = self._supervisor.session
            if session is not None and (out := await session.transcribe(job)) is not None:
                return out
            await anyio.sleep(_RETRY_S)

    async def run(self, ready: Callable[[], None]) -> None:
        """Start the worker, call `ready` once it first is, and supervise it until cancelled.

        Raises:
            WorkerRefused: the worker refused its model, or its first start died before it was ready.
            WorkerLost: 8 restarts in a row served nothing.
        """
        try:
            await self._supervisor.run(ready)
        finally:
            # What the worker held and what waits for one fail now, as the in-process queue's stop fails its jobs.
            self._stopped = engine_dead() if self.dead else shutting_down()
            if (session := self._supervisor.session) is not None:
                session.fail(self._stopped)
            self._supervisor.wake_waiters()

    # The speech kind of worker, as its supervisor asks (stages/remote/supervisor.py's `SessionKind`).

    def session(
        self, worker: WorkerProcess, *, on_ready: Callable[[SpeechReadyOut], None], lose: Callable[[str], None]
    ) -> SpeechSession:
        capacity = 2 * self._settings.exclusive_pending + 1
        return SpeechSession(worker=worker, capacity=capacity, on_ready=on_ready, lose=lose)

    def first_frame(self, beside_others: bool) -> SpeechSettingsIn:
        # Never logged nor sent: the worker needs no keys.
        values = attrs.asdict(attrs.evolve(self._settings, api_key=None))
        return SpeechSettingsIn(values=values, info=self.info, yield_cpu=beside_others)

    def on_ready(self, message: SpeechReadyOut) -> None:
        self._languages = message.languages

    def held(self, session: SpeechSession | None) -> Mapping[str, int]:
        return {"transcriptions": session.holding if session is not None else 0}

    async def fail(self, session: SpeechSession | None, error: RequestError) -> None:
        """Every transcription the lost worker held fails; those not yet sent wait for the next worker."""
        if session is not None:
            session.fail(error)
