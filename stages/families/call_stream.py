"""A call section's calls as events while the model writes them.

Each call starts (`ToolCallStart`) once its name is whole, its arguments
follow in pieces (`ToolCallDelta`) as a family's progress reader reads
them (`progress.py`), and it ends (`ToolCall`) when its section does, with
arguments that are exactly its pieces joined. A call already started when
its section turns out broken, or is cut off by the end of the output,
ends with the arguments written so far: a start cannot be taken back.
Pure; no I/O.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

import attrs

from pipeline.events import CompletionEvent, ToolCall, ToolCallDelta, ToolCallStart
from stages.families.progress import CallProgress


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@attrs.define
class _Started:
    id: str
    name: str
    sent: str = ""


@attrs.define
class CallStream:
    """The calls of one section; `first` is the completion's index of its first call."""

    first: int = 0
    _started: list[_Started] = attrs.field(factory=list, init=False)

    @property
    def started(self) -> bool:
        return bool(self._started)

    def update(self, progress: Sequence[CallProgress], events: list[CompletionEvent]) -> None:
        for offset, call in enumerate(progress):
            if call.name is None:
                return
            if offset == len(self._started):
                self._started.append(_Started(call_id(), call.name))
                events.append(ToolCallStart(index=self.first + offset, id=self._started[-1].id, name=call.name))
            started = self._started[offset]
            if call.name == started.name and call.arguments.startswith(started.sent):
                self._send(offset, call.arguments, events)

    def finish(self, calls: Sequence[tuple[str, str]] | None, events: list[CompletionEvent]) -> int:
        """End the section with its `calls` (name, arguments), or None where it did not parse:
        then the started calls end as written. Returns how many calls ended."""
        if calls is None:
            calls = [(started.name, started.sent) for started in self._started]
        for offset, (name, arguments) in enumerate(calls):
            if offset >= len(self._started):
                # Never started: the call goes whole.
                events.append(ToolCall(index=self.first + offset, id=call_id(), name=name, arguments=arguments))
                continue
            started = self._started[offset]
            if arguments.startswith(started.sent):
                self._send(offset, arguments, events)
            # Else (a reader and a parser that disagree) the parser's call stands in the body.
            events.append(ToolCall(index=self.first + offset, id=started.id, name=started.name, arguments=arguments))
        return len(calls)

    def _send(self, offset: int, arguments: str, events: list[CompletionEvent]) -> None:
        started = self._started[offset]
        if len(arguments) > len(started.sent):
            events.append(ToolCallDelta(index=self.first + offset, arguments=arguments[len(started.sent) :]))
            started.sent = arguments


def final_arguments(progress: Sequence[CallProgress] | None, parsed: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The parsed calls, each with its arguments as streamed where the reader read the same call."""
    if progress is None or len(progress) != len(parsed):
        return parsed
    return [
        (name, call.arguments if call.name == name and _same_json(call.arguments, arguments) else arguments)
        for (name, arguments), call in zip(parsed, progress, strict=True)
    ]


def _same_json(streamed: str, parsed: str) -> bool:
    try:
        return bool(json.loads(streamed) == json.loads(parsed))
    except (json.JSONDecodeError, RecursionError):
        return False
