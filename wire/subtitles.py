"""Subtitles of a transcript's segments: SubRip (`srt`) and WebVTT (`vtt`), as OpenAI's Whisper returns them.

SubRip numbers each cue from 1 and writes `HH:MM:SS,mmm`; WebVTT opens with
`WEBVTT` and writes `HH:MM:SS.mmm`. Cues are separated by a blank line, and
a cue's text is the segment's without its leading space.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.transcripts import Segment


def timestamp(seconds: float, *, separator: str) -> str:
    """`HH:MM:SS<separator>mmm`, to the millisecond (never negative)."""
    milliseconds = max(0, round(seconds * 1000))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    whole, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{separator}{milliseconds:03d}"


def srt(segments: Sequence[Segment]) -> str:
    cues = [
        f"{number}\n{timestamp(segment.start, separator=',')} --> {timestamp(segment.end, separator=',')}\n"
        f"{_cue_text(segment)}\n"
        for number, segment in enumerate(segments, start=1)
    ]
    return "\n".join(cues)


def vtt(segments: Sequence[Segment]) -> str:
    cues = [
        f"{timestamp(segment.start, separator='.')} --> {timestamp(segment.end, separator='.')}\n{_cue_text(segment)}\n"
        for segment in segments
    ]
    return "\n".join(["WEBVTT\n", *cues])


def _cue_text(segment: Segment) -> str:
    # A line of its own: "-->" would open a cue's timing, and a blank line would end the cue.
    return " ".join(segment.text.replace("-->", "->").split())
