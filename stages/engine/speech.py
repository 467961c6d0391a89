"""A speech-to-text model served by name beside (or instead of) the chat models: its checks, its model's home.

The fleet hosts it as it hosts an `Engine` (the same run, drain and
statistics), so `--model tiny-whisper` serves it alone and `--model tiny
--model tiny-whisper` both. Where its model runs is chosen once, when it is
built, by the setting that places a chat model (`Settings.model_in_process`):
by default in a worker process of its own, supervised and restarted as a chat
model's worker is (stages/remote/speech_gateway.py's `RemoteSpeech`, over
`workers/speech_host.py`), so a Whisper crash fails only its own
transcriptions; under `--in-process` on a thread of the HTTP process
(stages/engine/speech_thread.py's `SpeechThread`, which is also what runs in
the worker). Either way transcriptions are admitted with the embeddings'
bounds (429 when full, 503 while draining) and run one at a time, a job whose
client left dropped unrun; the routes (edge/audio_routes.py) see one face.
A chat model's rows never wait for it: they decode on their own model thread.
"""

from __future__ import annotations

import anyio
import attrs
from anyio.abc import TaskStatus

from pipeline.admission import AdmissionStatistics
from pipeline.errors import invalid
from pipeline.settings import Settings
from pipeline.transcripts import Transcript, TranscriptionRequest
from stages.engine.speech_thread import SpeechThread
from stages.model_thread.exclusive import ExclusiveStatistics
from stages.models.whisper import SpeechInfo
from stages.remote.speech_gateway import RemoteSpeech
from stages.remote.status import WorkerStatus

# How often a drain looks whether the last admitted transcription has finished.
_DRAIN_POLL_S = 0.05


@attrs.frozen(kw_only=True)
class SpeechStatistics:
    admission: AdmissionStatistics
    exclusive: ExclusiveStatistics
    running: bool
    dead: bool
    # The model's worker process (its state, pid and restarts); None when it runs in the HTTP process.
    worker: WorkerStatus | None = None


@attrs.define(eq=False)
class SpeechEngine:
    _settings: Settings = attrs.field(alias="settings")
    info: SpeechInfo = attrs.field(alias="info")
    _side: SpeechThread | RemoteSpeech = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        settings, info = self._settings, self.info
        in_process = settings.model_in_process
        self._side = SpeechThread.of(settings, info) if in_process else RemoteSpeech(settings=settings, info=info)

    @property
    def dead(self) -> bool:
        return self._side.dead

    @property
    def ready(self) -> bool:
        side = self._side
        return side.running and not side.dead and not side.statistics().admission.draining

    def worker(self) -> WorkerStatus | None:
        """The model's worker (as `Engine.worker`); None when the model runs in this process."""
        return self._side.status() if isinstance(self._side, RemoteSpeech) else None

    async def run(self, *, task_status: TaskStatus[SpeechEngine] = anyio.TASK_STATUS_IGNORED) -> None:
        """Load the model (in its worker, or on its thread here) and serve transcriptions until cancelled.

        Raises:
            Exception: the model did not load; `WorkerRefused` with the worker's reason when it runs in one.
        """
        await self._side.run(lambda: task_status.started(self))

    async def transcribe(self, request: TranscriptionRequest, *, request_id: str, trace_id: str) -> Transcript:
        """The request's transcript (or English translation).

        Raises:
            RequestError: 400 naming the field (language, file), 429/503 from admission, 503 `worker_lost` when
                the model's worker was lost while it held the transcription.
        """
        self._check_language(request.language)
        settings = self._settings
        if len(request.audio) > settings.audio_max_bytes:
            raise invalid(
                f"'file' is {len(request.audio)} bytes, more than this server's limit of "
                f"{settings.audio_max_bytes} (MLX_RELAY_AUDIO_MAX_BYTES)",
                param="file",
                code="audio_too_large",
            )
        return await self._side.transcribe(request, request_id=request_id, trace_id=trace_id)

    def _check_language(self, language: str | None) -> None:
        if language is None:
            return
        if language not in self._side.languages():
            raise invalid(
                f"'language' {language!r} is not an ISO-639-1 code Whisper knows",
                param="language",
                code="unsupported_language",
            )
        if language != "en" and not self.info.multilingual:
            raise invalid(f"'language' {language!r}: the model '{self.info.name}' is English-only", param="language")

    def start_draining(self) -> None:
        self._side.start_draining()

    async def drain(self, timeout: float) -> None:
        """Refuse new work; wait (at most `timeout`) for admitted transcriptions to finish."""
        self._side.start_draining()
        with anyio.move_on_after(timeout):
            while self._side.statistics().admission.in_flight:
                await anyio.sleep(_DRAIN_POLL_S)

    def statistics(self) -> SpeechStatistics:
        side = self._side
        exclusive = side.statistics()
        return SpeechStatistics(
            admission=exclusive.admission,
            exclusive=exclusive,
            running=side.running,
            dead=side.dead,
            worker=self.worker(),
        )
