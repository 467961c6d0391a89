"""gpt-oss's output read as harmony messages, as it streams.

A completion is a run of messages, each a header, `<|message|>`, a body,
and a terminator (`<|end|>`, `<|call|>`, `<|return|>`, the next
`<|start|>`, or the end of the output). The header names the channel and,
in the role part or the channel part, a recipient (`to=functions.x`).
Where a body goes is decided once its header is whole:

- to `functions.x` (or to an offered tool's bare name), on any channel: a
  call to `x`, parsed when its body ends; a body that is not a JSON object
  is kept as text when a terminator closed it, and dropped when the output
  was cut inside it (no markup leaks);
- to any other recipient (built-in tools: `python`, `browser.*`): dropped;
- `analysis`: reasoning; `final`, and `commentary` with no recipient (a
  preamble): the answer; any other channel: dropped.

Headers are never text. A header cut off by the end of the output is
dropped, unless the model wrote no harmony markup at all: then its text
is the answer. Only a suffix that could still become a marker is held
back between feeds. Pure; no I/O.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence

import attrs

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, append_text
from pipeline.requests import Tool
from stages.families.base import in_json_string, json_object
from stages.families.call_stream import CallStream, final_arguments
from stages.families.progress import CallProgress, named_arguments
from stages.stops import earliest, hold_back

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
TOKENS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
_TERMINATORS = (END, CALL, RETURN)
# What ends reasoning or an answer: gpt-oss closes them with `<|end|>` (`<|return|>` after the
# final one); a `<|channel|>` or `<|call|>` inside them is the model quoting its own markup.
_TEXT_ENDS = (END, RETURN, START)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_FUNCTIONS = "functions."


class Route(enum.Enum):
    REASONING = "reasoning"
    ANSWER = "answer"
    CALL = "call"
    DROP = "drop"


class _State(enum.Enum):
    HEADER = "header"
    BODY = "body"
    BETWEEN = "between"


def route(header: str, tools: Sequence[Tool], calls: bool) -> tuple[Route, str]:
    """Where a message with `header` goes, and the tool it calls (or "")."""
    role, _, _ = header.partition(CHANNEL)
    channel_part = header.rpartition(CHANNEL)[2] if CHANNEL in header else header.removeprefix("assistant")
    named = _RECIPIENT.search(channel_part) or _RECIPIENT.search(role)
    if named is not None:
        recipient = named.group(1)
        name = recipient.removeprefix(_FUNCTIONS)
        is_function = recipient.startswith(_FUNCTIONS) or any(tool.name == recipient for tool in tools)
        return (Route.CALL, name) if calls and is_function and name else (Route.DROP, "")
    channel = channel_part.split(CONSTRAIN)[0].strip()
    if channel == "analysis":
        return Route.REASONING, ""
    if channel in ("final", "commentary"):
        return Route.ANSWER, ""
    return Route.DROP, ""


@attrs.define
class HarmonySplitter:
    """Completion events out of harmony text split anywhere; the same `feed` as `MarkupSplitter`."""

    _tools: tuple[Tool, ...] = attrs.field(alias="tools")
    # Calls are parsed only where the request offers tools.
    _parse_calls: bool = attrs.field(alias="parse_calls")
    # The generation prompt ends in `<|start|>assistant`: the output opens with a header.
    _state: _State = attrs.field(default=_State.HEADER, init=False)
    _held: str = attrs.field(default="", init=False)
    _header: str = attrs.field(default="", init=False)
    _route: Route = attrs.field(default=Route.DROP, init=False)
    _name: str = attrs.field(default="", init=False)
    _body: str = attrs.field(default="", init=False)
    _calls: int = attrs.field(default=0, init=False)
    _call_stream: CallStream = attrs.field(factory=CallStream, init=False)
    _saw_markup: bool = attrs.field(default=False, init=False)
    _answered: bool = attrs.field(default=False, init=False)

    @property
    def reasoning(self) -> bool:
        return self._state is _State.BODY and self._route is Route.REASONING

    @property
    def tool_calls(self) -> int:
        return self._calls

    def feed(self, text: str, *, final: bool = False, cut: bool = False) -> list[CompletionEvent]:
        events: list[CompletionEvent] = []
        buffer, self._held = self._held + text, ""
        while buffer:
            found = earliest(buffer, TOKENS)
            if found is None:
                ready, self._held = hold_back(buffer, TOKENS, final=final)
                self._text(ready, events)
                break
            index, token = found
            self._text(buffer[:index], events)
            self._token(token, events)
            buffer = buffer[index + len(token) :]
        if final:
            self._finish(events, cut=cut)
        elif self._state is _State.BODY and self._route is Route.CALL:
            # The recipient named the tool in the header: its arguments stream as they are written.
            self._call_stream.update(self._progress(), events)
        return events

    def _text(self, text: str, events: list[CompletionEvent]) -> None:
        if not text:
            return
        if self._state is _State.BETWEEN:
            # A header whose `<|start|>` the model left out.
            self._state, self._header = _State.HEADER, ""
        if self._state is _State.HEADER:
            self._header += text
        elif self._route is Route.REASONING:
            append_text(events, ReasoningDelta(text=text))
        elif self._route is Route.ANSWER:
            append_text(events, TextDelta(text=text))
        else:
            self._body += text

    def _token(self, token: str, events: list[CompletionEvent]) -> None:
        self._saw_markup = True
        if self._state is _State.BODY and self._quoted(token):
            self._text(token, events)
        elif token == MESSAGE:
            self._open(events)
        elif token in _TERMINATORS:
            self._close(events, terminated=True)
            self._state = _State.BETWEEN
        elif token == START:
            self._close(events, terminated=True)
            self._state, self._header = _State.HEADER, ""
        elif self._state is _State.HEADER:
            self._header += token
        else:
            # `<|channel|>` or `<|constrain|>` outside a header opens the next one.
            self._close(events, terminated=True)
            self._state, self._header = _State.HEADER, token

    def _quoted(self, token: str) -> bool:
        """`token` is text of the message body it stands in, not a marker."""
        if token in (MESSAGE, CONSTRAIN):
            return True
        if self._route in (Route.REASONING, Route.ANSWER):
            return token not in _TEXT_ENDS
        return in_json_string(self._body)

    def _open(self, events: list[CompletionEvent]) -> None:
        self._route, self._name = route(self._header, self._tools, self._parse_calls)
        self._state, self._header, self._body = _State.BODY, "", ""
        if self._route is Route.ANSWER and self._answered:
            # Two answer messages (a preamble, then the final one) read as two paragraphs.
            append_text(events, TextDelta(text="\n\n"))

    def _close(self, events: list[CompletionEvent], *, terminated: bool, cut: bool = False) -> None:
        """End the open message: `terminated` by a marker, or by the end of the output (`cut` at max tokens)."""
        if self._state is not _State.BODY:
            return
        if self._route is Route.ANSWER:
            self._answered = True
        if self._route is Route.CALL:
            stream, self._call_stream = self._call_stream, CallStream(first=self._calls)
            progress = self._progress()
            stream.update(progress, events)
            arguments = json_object(self._body.strip())
            if arguments is not None:
                parsed = final_arguments(progress, [(self._name, json.dumps(arguments, ensure_ascii=False))])
                self._calls += stream.finish(parsed, events)
            elif cut and stream.started:
                # Cut off at max tokens: still a call, with the arguments written so far.
                self._calls += stream.finish(None, events)
            elif terminated and self._body.strip() and not stream.started:
                append_text(events, TextDelta(text=self._body))
            self._call_stream = CallStream(first=self._calls)
        self._body = ""

    def _progress(self) -> list[CallProgress]:
        """The call once its body opens a JSON object (any other body is kept as text)."""
        return named_arguments(self._name, self._body, 0) if self._body.lstrip().startswith("{") else []

    def _finish(self, events: list[CompletionEvent], *, cut: bool) -> None:
        if self._state is _State.HEADER and not self._saw_markup:
            append_text(events, TextDelta(text=self._header))
        self._close(events, terminated=False, cut=cut)
        self._state, self._header = _State.BETWEEN, ""
