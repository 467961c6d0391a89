"""stages/remote/speech_crossing.py: the speech worker's crossing, over a real Unix socket (no model).

The invariants: a transcription crosses with its request whole (the audio's bytes, its enums) and comes back as
the transcript with every field the wire layer renders, or as the job's error; and the worker's one reader of a
first frame (workers/main.py: the chat catalogue's union and the speech one's together) tells a speech model's
settings from the chat messages, so one process, a spare taken idle included, can serve either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anyio.abc import ByteStream

from pipeline.errors import invalid
from pipeline.transcripts import ResponseFormat, Segment, Task, Transcript, TranscriptionRequest, Word
from stages.models.whisper import SpeechInfo
from stages.remote.convert import error_out, request_error
from stages.remote.crossing import AbortIn, BeatOut, CancelIn, CloseIn, RefusedOut, StatsIn, ToWorker
from stages.remote.frames import FrameReader, FrameWriter
from stages.remote.speech_crossing import (
    SpeechReadyOut,
    SpeechSettingsIn,
    ToSpeechFront,
    ToSpeechWorker,
    TranscribeIn,
    TranscriptOut,
)
from tests.stages.remote.test_remote_crossing import anyio_backend, pair  # noqa: F401  (fixtures: a connected socket pair, both backends)


def _transcript() -> Transcript:
    segment = Segment(
        id=0,
        seek=0,
        start=0.0,
        end=1.25,
        text=" hello",
        tokens=(50364, 2425),
        temperature=0.2,
        avg_logprob=None,
        compression_ratio=0.8,
        no_speech_prob=0.1,
    )
    words = (Word(word="hello", start=0.0, end=1.25),)
    return Transcript(text="hello", language="english", duration=1.5, segments=(segment,), words=words)


async def test_speech_messages_cross_with_their_type(pair: tuple[ByteStream, ByteStream], tmp_path: Path) -> None:
    front, worker = pair
    info = SpeechInfo(
        path=tmp_path, name="mlx-relay/tiny-whisper", context_window=64, vocab_size=51865, multilingual=True
    )
    request = TranscriptionRequest(
        audio=bytes(range(256)) * 40,
        filename="clip.wav",
        model="whisper-1",
        task=Task.TRANSLATE,
        prompt="Names: Ada.",
        temperature=0.2,
        response_format=ResponseFormat.VERBOSE_JSON,
        words=True,
    )
    to_worker: list[Any] = [
        SpeechSettingsIn(values={"exclusive_pending": 3, "audio_max_seconds": 1.5}, info=info, yield_cpu=True),
        TranscribeIn(job_id=7, request=request, request_id="r", trace_id="t"),
        CancelIn(job_id=7),
        StatsIn(),
        # The chat catalogue's messages still read as theirs through the same reader.
        AbortIn(request_id="a"),
        CloseIn(),
    ]
    writer, reader = FrameWriter(front), FrameReader[Any](worker, ToWorker | ToSpeechWorker)
    for message in to_worker:
        await writer.send(message)
    assert [await reader.receive() for _ in to_worker] == to_worker

    refusal = invalid("'file' is not audio", param="file", code="invalid_audio")
    to_front: list[ToSpeechFront] = [
        SpeechReadyOut(pid=42, languages={"en": "english", "yue": "cantonese"}),
        BeatOut(),
        TranscriptOut(job_id=7, transcript=_transcript()),
        TranscriptOut(job_id=8, error=error_out(refusal)),
        RefusedOut(reason="ModuleNotFoundError: mlx_whisper"),
    ]
    back, front_reader = FrameWriter(worker), FrameReader[ToSpeechFront](front, ToSpeechFront)
    for answer in to_front:
        await back.send(answer)
    received = [await front_reader.receive() for _ in to_front]
    assert received == to_front
    failed = received[3]
    assert isinstance(failed, TranscriptOut) and failed.error is not None
    rebuilt = request_error(failed.error)
    assert (rebuilt.kind, rebuilt.message, rebuilt.param, rebuilt.code) == (
        refusal.kind,
        refusal.message,
        "file",
        "invalid_audio",
    )
