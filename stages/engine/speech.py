"""A speech-to-text model served by name beside (or instead of) the chat models: its thread, its queue.

The fleet hosts it as it hosts an `Engine` (the same run, drain and
statistics), so `--model tiny-whisper` serves it alone and `--model tiny
--model tiny-whisper` both. Its model runs on a thread of its own, the only
thread that calls MLX for it, in the process that serves HTTP (docs/speech.md
says why, with the figures). Transcriptions go through an `ExclusiveQueue`:
the embeddings' admission (`MLX_RELAY_EXCLUSIVE_PENDING` waiting, then 429
after `MLX_RELAY_ADMISSION_TIMEOUT`; 503 while draining), one job at a time,
a job whose client left dropped unrun. A chat model's rows never wait for
it: they decode on their own model thread (in their worker process by
default), not between this model's jobs.
"""

from __future__ import annotations

import contextlib
import threading
from functools import partial
from typing import Any

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus

from pipeline.admission import AdmissionStatistics
from pipeline.errors import invalid
from pipeline.settings import Settings
from pipeline.transcripts import Transcript, TranscriptionRequest
from stages.model_thread.exclusive import ExclusiveQueue, ExclusiveStatistics
from stages.model_thread.transcribe import TranscribeWork
from stages.models.whisper import SpeechInfo, language_codes, load_speech_model
from stages.prompt.audio import decode_audio

log = structlog.get_logger(stage="speech")
# Audio files decoded at once (each holds its samples until its job runs).
_DECODERS = 2


@attrs.frozen(kw_only=True)
class SpeechStatistics:
    admission: AdmissionStatistics
    exclusive: ExclusiveStatistics
    running: bool
    dead: bool


@attrs.define(eq=False)
class SpeechEngine:
    _settings: Settings = attrs.field(alias="settings")
    info: SpeechInfo = attrs.field(alias="info")
    _queue: ExclusiveQueue = attrs.field(init=False)
    _wake: threading.Event = attrs.field(factory=threading.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _running: bool = attrs.field(default=False, init=False)
    dead: bool = attrs.field(default=False, init=False)
    _decoders: anyio.CapacityLimiter = attrs.field(factory=lambda: anyio.CapacityLimiter(_DECODERS), init=False)

    def __attrs_post_init__(self) -> None:
        self._queue = ExclusiveQueue.of(self._settings)
        self._queue.wake_with(self._wake.set)

    @property
    def ready(self) -> bool:
        return self._running and not self.dead and not self._queue.statistics().admission.draining

    async def run(self, *, task_status: TaskStatus[SpeechEngine] = anyio.TASK_STATUS_IGNORED) -> None:
        """Load the model on its thread and serve transcriptions until cancelled."""
        token = anyio.lowlevel.current_token()
        loaded = anyio.Event()
        failure: list[BaseException] = []

        def settle(error: BaseException | None) -> None:
            if error is not None:
                failure.append(error)
            loaded.set()

        thread = threading.Thread(
            target=self._serve, args=(token, settle), name=f"speech:{self.info.name}", daemon=True
        )
        thread.start()
        try:
            await loaded.wait()
            if failure:
                raise failure[0]
            self._running = True
            log.info("speech.ready", model=self.info.name, path=str(self.info.path))
            task_status.started(self)
            await anyio.sleep_forever()
        finally:
            self._running = False
            self._closing = True
            self._wake.set()
            self._queue.stop(dead=False)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(thread.join)

    def _serve(self, token: anyio.lowlevel.EventLoopToken, settle: Any) -> None:
        """The speech model's thread: load, then run queued jobs as they arrive."""
        try:
            model = load_speech_model(self.info)
        except BaseException as error:  # noqa: BLE001 -- handed to the loop, which raises it as the start's failure
            anyio.from_thread.run_sync(settle, error, token=token)
            return
        anyio.from_thread.run_sync(settle, None, token=token)
        try:
            self._run_jobs(model, token)
        except BaseException:
            # Not a job's failure (those are isolated to their job): the thread cannot go on. Its model is dead,
            # as a chat engine's is when its step fails; queued and later jobs fail with 503.
            log.exception("speech.thread_failed", model=self.info.name)
            self.dead = True
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(self._queue.stop, True, token=token)

    def _run_jobs(self, model: Any, token: anyio.lowlevel.EventLoopToken) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            while self._queue.pending and not self._closing:
                done = self._queue.between_steps(model, busy=False)
                try:
                    anyio.from_thread.run_sync(self._queue.deliver, done, token=token)
                except RuntimeError:
                    return  # the loop has ended

    async def transcribe(self, request: TranscriptionRequest, *, request_id: str, trace_id: str) -> Transcript:
        """The request's transcript (or English translation).

        Raises:
            RequestError: 400 naming the field (language, file), 429/503 from the queue.
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
        decode = partial(decode_audio, request.audio, request.filename, max_seconds=settings.audio_max_seconds)
        samples = await anyio.to_thread.run_sync(decode, limiter=self._decoders)
        work = TranscribeWork(request=request, samples=samples, info=self.info)
        transcript: Transcript = await self._queue.submit(
            work, kind="transcribe", request_id=request_id, trace_id=trace_id, rate_key=self.info.name
        )
        return transcript

    def _check_language(self, language: str | None) -> None:
        if language is None:
            return
        codes = language_codes()
        if language not in codes:
            raise invalid(
                f"'language' {language!r} is not an ISO-639-1 code Whisper knows",
                param="language",
                code="unsupported_language",
            )
        if language != "en" and not self.info.multilingual:
            raise invalid(f"'language' {language!r}: the model '{self.info.name}' is English-only", param="language")

    def start_draining(self) -> None:
        self._queue.start_draining()

    async def drain(self, timeout: float) -> None:
        """Refuse new work; wait (at most `timeout`) for admitted transcriptions to finish."""
        self._queue.start_draining()
        with anyio.move_on_after(timeout):
            while self._queue.statistics().admission.in_flight:
                await anyio.sleep(0.05)

    def statistics(self) -> SpeechStatistics:
        exclusive = self._queue.statistics()
        return SpeechStatistics(
            admission=exclusive.admission, exclusive=exclusive, running=self._running, dead=self.dead
        )
