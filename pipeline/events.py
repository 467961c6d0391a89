"""Completion events: what the sink tells a stream protocol.

These are the only types that `wire/` and `stages/` share about output.
Events carry deltas; a protocol turns a list of them into frames.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import cast

import attrs


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    # The model ended its turn after calling one or more tools.
    TOOL_CALLS = "tool_calls"


@attrs.frozen(kw_only=True)
class TextDelta:
    """Answer text."""

    text: str


@attrs.frozen(kw_only=True)
class ReasoningDelta:
    """Text between the model's think markers: never part of the answer."""

    text: str


@attrs.frozen(kw_only=True)
class ToolCall:
    """One tool call, ended: parsed from the model's markup.

    `index` counts the completion's calls from 0; `arguments` is the JSON
    text of an object, as OpenAI's `function.arguments` carries it, or of
    as much of one as was written when the output was cut (max tokens).
    """

    index: int
    id: str
    name: str
    arguments: str


@attrs.frozen(kw_only=True)
class ToolCallStart:
    """A call whose tool is known and whose arguments are still being written.

    Its `ToolCallDelta`s follow, then its `ToolCall`, whose `arguments` are
    exactly the deltas' pieces joined: a stream sends the start and the
    pieces, a whole body reads the `ToolCall` alone.
    """

    index: int
    id: str
    name: str


@attrs.frozen(kw_only=True)
class ToolCallDelta:
    """The next piece of a started call's arguments (JSON text, cut anywhere)."""

    index: int
    arguments: str


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """One token and its log probability under the distribution it was sampled from."""

    token: str
    bytes: tuple[int, ...]
    logprob: float


@attrs.frozen(kw_only=True)
class Logprobs:
    """Logprobs of tokens generated in one step, in order; `top` holds each one's alternatives."""

    chosen: tuple[TokenLogprob, ...]
    top: tuple[tuple[TokenLogprob, ...], ...]


CompletionEvent = TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta | ToolCall | Logprobs


def append_text(events: list[CompletionEvent], event: TextDelta | ReasoningDelta) -> None:
    """Append `event`, joining it to a last event of the same kind: one run, one event."""
    last = events[-1] if events else None
    if isinstance(last, (TextDelta, ReasoningDelta)) and type(last) is type(event):
        events[-1] = attrs.evolve(event, text=last.text + event.text)
    else:
        events.append(event)


@attrs.frozen(kw_only=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # Of the prompt tokens, those served from the prompt cache.
    cached_tokens: int = 0
    # Of the completion tokens, those spent inside the think markers.
    reasoning_tokens: int = 0

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


def content_runs(events: Sequence[CompletionEvent]) -> list[TextDelta | ReasoningDelta | ToolCall]:
    """The content of `events`: adjacent text (or reasoning) joined into one run, each call its own.

    Empty text and logprobs are left out: what a whole message's body shows.
    """
    runs: list[CompletionEvent] = []
    for event in events:
        if isinstance(event, (TextDelta, ReasoningDelta)) and event.text:
            append_text(runs, event)
        elif isinstance(event, ToolCall):
            runs.append(event)
    return cast("list[TextDelta | ReasoningDelta | ToolCall]", runs)  # only those were appended


StreamRun = TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta | ToolCall


def stream_runs(events: Sequence[CompletionEvent], *, join: bool = True) -> list[StreamRun]:
    """`content_runs` for a stream: calls' starts and argument pieces too; with `join`, a call's adjacent pieces
    are joined as text is, else each event stays one run (a delta per decode step, as OpenAI's events are)."""
    runs: list[CompletionEvent] = []
    for event in events:
        last = runs[-1] if runs else None
        if isinstance(event, (TextDelta, ReasoningDelta)) and event.text:
            if join:
                append_text(runs, event)
            else:
                runs.append(event)
        elif (
            join and isinstance(event, ToolCallDelta) and isinstance(last, ToolCallDelta) and last.index == event.index
        ):
            runs[-1] = attrs.evolve(last, arguments=last.arguments + event.arguments)
        elif isinstance(event, (ToolCallStart, ToolCallDelta, ToolCall)):
            runs.append(event)
    return cast("list[StreamRun]", runs)  # only those were appended
