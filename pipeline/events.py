"""Completion events: what the sink tells a stream protocol.

These are the only types that `wire/` and `stages/` share about output.
Events carry deltas; a protocol turns a list of them into frames.
"""

from __future__ import annotations

import enum

import attrs


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"


@attrs.frozen(kw_only=True)
class TextDelta:
    text: str


CompletionEvent = TextDelta


@attrs.frozen(kw_only=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen(kw_only=True)
class Summary:
    """How a completion ended; sent once, after its last events.

    `stop_sequence` is the client's stop string that ended it, if any (an
    EOS token ends with STOP and no stop_sequence).
    """

    finish_reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
