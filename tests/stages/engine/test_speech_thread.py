"""stages/engine/speech_thread.py: transcriptions run in the order they arrived, though their files decode at once.

The real tiny-whisper on its thread, as it runs under `--in-process` and inside the speech worker: a 30-second file
at 44.1 kHz in stereo (its decoding and resampling take hundreds of ms) and, just after it, a 1.5-second one at
16 kHz, which decodes first. It still queues, and runs, behind the long one, so a
worker runs what the front admitted in the front's order, and a client that leaves while queued behind a long
transcription has its job dropped unrun (tests/e2e/test_speech.py).
"""

from __future__ import annotations

import anyio
from anyio.abc import TaskStatus

from pipeline.settings import Settings
from pipeline.transcripts import TranscriptionRequest
from stages.engine.speech_thread import SpeechThread
from stages.models.whisper import ensure_tiny_whisper, read_speech_info
from tests.speech_clips import clip


async def test_a_short_file_sent_just_after_a_long_one_runs_after_it() -> None:
    info = read_speech_info(ensure_tiny_whisper(), "mlx-relay/tiny-whisper")
    thread = SpeechThread.of(Settings(), info)
    finished: list[str] = []

    async def transcribe(name: str, audio: bytes, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        request = TranscriptionRequest(audio=audio, filename=f"{name}.wav", model="whisper-1", temperature=0.2)
        # Its caller goes on once this has arrived (`transcribe` up to its first checkpoint): under trio tasks
        # started together run in no set order.
        task_status.started()
        await thread.transcribe(request, request_id=name, trace_id=name)
        finished.append(name)

    async with anyio.create_task_group() as group:
        ready = anyio.Event()
        group.start_soon(thread.run, ready.set)
        await ready.wait()
        async with anyio.create_task_group() as requests:
            await requests.start(transcribe, "long", clip("WAV", seconds=30.0, rate=44_100, channels=2))
            await requests.start(transcribe, "short", clip("WAV", seconds=1.5))
        group.cancel_scope.cancel()
    assert finished == ["long", "short"]
