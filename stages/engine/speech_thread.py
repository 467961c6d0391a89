"""A speech model on a thread of its own: loaded there, its transcriptions queued to it, one at a time.

What runs the Whisper model wherever it runs: in the HTTP process under `--in-process`
(`stages/engine/speech.py`'s `SpeechEngine` holds one), and in a speech worker process by default
(`workers/speech_host.py` holds one there). The thread is the only one that calls MLX for this model.
Transcriptions go through an `ExclusiveQueue`: the embeddings' admission (`MLX_RELAY_EXCLUSIVE_PENDING` waiting,
then 429 after `MLX_RELAY_ADMISSION_TIMEOUT`; 503 while draining), one job at a time, a job whose client left
dropped unrun. Its audio is decoded here too, before the job queues, by libsndfile in a decoding thread
(`stages/prompt/audio.py`), so a file that crashes the decoder takes down only the process that runs the model.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import attrs
import structlog

from pipeline.settings import Settings
from pipeline.transcripts import Transcript, TranscriptionRequest
from stages.model_thread.exclusive import ExclusiveQueue, ExclusiveStatistics
from stages.model_thread.transcribe import TranscribeWork
from stages.models.whisper import SpeechInfo, language_codes, load_speech_model
from stages.prompt.audio import decode_audio

log = structlog.get_logger(stage="speech")
# Audio files decoded at once (each holds its samples until its job runs).
_DECODERS = 2


@attrs.define
class _ArrivalOrder:
    """Transcriptions queue in the order they arrived, though their files decode at once: a short file that came
    just after a long one decodes first, and would otherwise queue, and run, ahead of it. In a worker that reordered
    what the front had admitted in order (and a client that left while queued behind the long one saw its job run).
    """

    _arrived: int = 0
    # The earliest arrival that has not yet queued (or given up); those after it that are done wait in `_passed`.
    _head: int = 1
    _passed: set[int] = attrs.field(factory=set)
    _moved: anyio.Event = attrs.field(factory=anyio.Event)

    def arrive(self) -> int:
        self._arrived += 1
        return self._arrived

    async def turn(self, ticket: int) -> None:
        """Wait until every earlier arrival has queued or given up."""
        while self._head < ticket:
            await self._moved.wait()

    def passed(self, ticket: int) -> None:
        """`ticket` queues now (without a checkpoint before it is in the queue) or gave up: later ones may follow."""
        self._passed.add(ticket)
        while self._head in self._passed:
            self._passed.remove(self._head)
            self._head += 1
        self._moved.set()
        self._moved = anyio.Event()


@attrs.define(eq=False)
class SpeechThread:
    _settings: Settings = attrs.field(alias="settings")
    info: SpeechInfo = attrs.field(alias="info")
    _queue: ExclusiveQueue = attrs.field(alias="queue")
    _wake: threading.Event = attrs.field(factory=threading.Event, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    running: bool = attrs.field(default=False, init=False)
    dead: bool = attrs.field(default=False, init=False)
    _decoders: anyio.CapacityLimiter = attrs.field(factory=lambda: anyio.CapacityLimiter(_DECODERS), init=False)
    _order: _ArrivalOrder = attrs.field(factory=_ArrivalOrder, init=False)

    def __attrs_post_init__(self) -> None:
        self._queue.wake_with(self._wake.set)

    @classmethod
    def of(cls, settings: Settings, info: SpeechInfo) -> SpeechThread:
        return cls(settings=settings, info=info, queue=ExclusiveQueue.of(settings))

    async def run(self, ready: Callable[[], None]) -> None:
        """Load the model on its thread, call `ready`, and serve transcriptions until cancelled.

        Raises:
            Exception: the model did not load (the start's failure).
        """
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
            self.running = True
            log.info("speech.ready", model=self.info.name, path=str(self.info.path))
            ready()
            await anyio.sleep_forever()
        finally:
            self.running = False
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
        """The request's transcript: its audio decoded, then queued to the model's thread.

        Raises:
            RequestError: 400 naming `file` (audio that does not decode, too long), 429/503 from the queue.
        """
        decode = partial(decode_audio, request.audio, request.filename, max_seconds=self._settings.audio_max_seconds)
        ticket = self._order.arrive()
        try:
            samples = await anyio.to_thread.run_sync(decode, limiter=self._decoders)
            await self._order.turn(ticket)
        finally:
            self._order.passed(ticket)
        work = TranscribeWork(request=request, samples=samples, info=self.info)
        # No checkpoint from here until the job is in the queue (a free admission ticket is taken without one; a
        # full queue's waiters are served in order), so the next arrival, woken above, cannot queue first.
        transcript: Transcript = await self._queue.submit(
            work, kind="transcribe", request_id=request_id, trace_id=trace_id, rate_key=self.info.name
        )
        return transcript

    def languages(self) -> dict[str, str]:
        """Whisper's languages by ISO-639-1 code (`mlx_whisper` is imported by then: the thread loaded the model)."""
        return language_codes()

    def start_draining(self) -> None:
        self._queue.start_draining()

    def statistics(self) -> ExclusiveStatistics:
        return self._queue.statistics()
