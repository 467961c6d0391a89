"""The messages that cross between the front and a speech model's worker (Whisper), beside the chat catalogue.

A speech worker is the same process as a chat model's (`python -m workers.main`, spawned or forked, or a
spare taken idle): its first frame says which it serves, `SpeechSettingsIn` here or the chat's `SettingsIn`
(stages/remote/crossing.py), and workers/main.py hands the connection to `workers/speech_host.py` for this one.
A transcription crosses as the request the wire layer decoded (`TranscriptionRequest`, its audio file's bytes
undecoded: the worker decodes them, docs/speech.md says why) and comes back as the `Transcript`, or the job's
error. The worker's answers that mean the same for both kinds (refused, its heartbeat) and the front's cancel and
stats requests are the chat catalogue's messages, so their tags stay unique across both unions and the worker's
reader decodes either kind's first frame. Its ready answer carries Whisper's language table, which the front checks
each request's `language` against: the table lives in `mlx_whisper`, whose import (scipy's signal package with it)
took 8 s of a loaded 2-core machine's CPU, which the front need not pay and must not pay on its event loop.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pipeline.transcripts import Transcript, TranscriptionRequest
from stages.models.whisper import SpeechInfo
from stages.remote.crossing import BeatOut, CancelIn, ErrorOut, RefusedOut, StatsIn

# -- front → worker ---------------------------------------------------------


class SpeechSettingsIn(msgspec.Struct, frozen=True, array_like=True, tag="speech_settings"):
    """The first frame of a speech worker: its engine's settings (as JSON values; no API keys) and the model the
    front found (`info`), which the worker loads as the in-process engine would."""

    values: dict[str, Any]
    info: SpeechInfo
    # Load nicer until ready, as `SettingsIn.yield_cpu` (workers/priority.py).
    yield_cpu: bool = False


class TranscribeIn(msgspec.Struct, frozen=True, array_like=True, tag="transcribe"):
    """One transcription or translation; `job_id` is the front's, for its answer and a cancel (`CancelIn`)."""

    job_id: int
    request: TranscriptionRequest
    request_id: str
    trace_id: str


ToSpeechWorker = SpeechSettingsIn | TranscribeIn | CancelIn | StatsIn


# -- worker → front ---------------------------------------------------------


class SpeechReadyOut(msgspec.Struct, frozen=True, array_like=True, tag="speech_ready"):
    """The model is loaded: the worker takes transcriptions."""

    pid: int
    # Whisper's languages, each ISO-639-1 code and its English name (stages/models/whisper.py's `language_codes`).
    languages: dict[str, str]


class TranscriptOut(msgspec.Struct, frozen=True, array_like=True, tag="transcript"):
    """A job's transcript, or its error (a 400 naming `file` for audio that does not decode, a 429 or 503)."""

    job_id: int
    transcript: Transcript | None = None
    error: ErrorOut | None = None


# `BeatOut.exclusive` carries the worker's queue figures; its chat fields stay None.
ToSpeechFront = TranscriptOut | SpeechReadyOut | BeatOut | RefusedOut
