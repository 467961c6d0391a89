"""The model's output markup: answer text, reasoning, and tool calls.

`MarkupSplitter` reads decoded text (after stop strings are applied) and
splits it into completion events by the markers mlx-lm infers for the
model (`<think>`…`</think>`, `<tool_call>`…`</tool_call>` and the other
families): reasoning goes to `ReasoningDelta`, each closed tool call is
parsed with mlx-lm's tool parser for the model into one `ToolCall`, and
the rest is `TextDelta`. Like the stop matcher it holds back only a suffix
that could still become a marker, so no marker is ever streamed as text.
Pure; no I/O.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall, append_text
from pipeline.jsontext import loads
from pipeline.requests import Tool
from stages.chat import template_tool
from stages.models.loading import Tokenizer
from stages.stops import earliest, partial_suffix

ToolParser = Callable[[str, Any], Any]


class Section(enum.Enum):
    ANSWER = "answer"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"


@attrs.frozen(kw_only=True)
class Markers:
    """What to look for in one request's output; None disables a kind."""

    think: tuple[str, str] | None = None
    tool_call: tuple[str, str] | None = None
    tool_parser: ToolParser | None = None
    tools: tuple[Tool, ...] = ()


@attrs.define
class MarkupSplitter:
    _markers: Markers = attrs.field(alias="markers")
    # The template may open the reasoning section itself (the prompt ends in `<think>`).
    _section: Section = attrs.field(default=Section.ANSWER, alias="section")
    _held: str = attrs.field(default="", init=False)
    _call_text: str = attrs.field(default="", init=False)
    _calls: int = attrs.field(default=0, init=False)
    # Whitespace next to a marker is layout, not content: it is dropped
    # after one, and held back until the next text shows none follows.
    _trim_next: bool = attrs.field(init=False)
    _space: str = attrs.field(default="", init=False)

    def __attrs_post_init__(self) -> None:
        self._trim_next = self._section is not Section.ANSWER

    @property
    def reasoning(self) -> bool:
        """Inside the think markers now."""
        return self._section is Section.REASONING

    @property
    def tool_calls(self) -> int:
        return self._calls

    def feed(self, text: str, *, final: bool = False) -> list[CompletionEvent]:
        """The events that `text` completes; with `final`, nothing is held back."""
        events: list[CompletionEvent] = []
        buffer, self._held = self._held + text, ""
        while buffer:
            markers = self._markers_here()
            found = earliest(buffer, markers)
            if found is None:
                keep = 0 if final else partial_suffix(buffer, markers)
                self._emit(buffer[: len(buffer) - keep], events)
                self._held = buffer[len(buffer) - keep :]
                break
            index, marker = found
            self._emit(buffer[:index], events)
            buffer = buffer[index + len(marker) :]
            self._cross(marker, events)
        if final:
            self._flush(events)
        return events

    def _markers_here(self) -> list[str]:
        """The markers that end the current section or open another."""
        think, tool = self._markers.think, self._markers.tool_call
        if self._section is Section.REASONING:
            return [think[1]] if think else []
        if self._section is Section.TOOL_CALL:
            return [tool[1]] if tool else []
        return [pair[0] for pair in (think, tool) if pair is not None]

    def _cross(self, marker: str, events: list[CompletionEvent]) -> None:
        think, tool = self._markers.think, self._markers.tool_call
        if self._section is Section.TOOL_CALL:
            events.append(self._parse_call())
            self._section = Section.ANSWER
        elif self._section is Section.REASONING:
            self._section = Section.ANSWER
        elif think is not None and marker == think[0]:
            self._section = Section.REASONING
        elif tool is not None and marker == tool[0]:
            self._section = Section.TOOL_CALL
        self._trim_next, self._space = True, ""

    def _emit(self, text: str, events: list[CompletionEvent]) -> None:
        if self._trim_next:
            text = text.lstrip()
            self._trim_next = not text
        if self._section is Section.TOOL_CALL:
            self._call_text += text
            return
        body = text.rstrip()
        if not body:
            self._space += text
            return
        text, self._space = self._space + body, text[len(body) :]
        kind = ReasoningDelta if self._section is Section.REASONING else TextDelta
        append_text(events, kind(text=text))

    def _flush(self, events: list[CompletionEvent]) -> None:
        if self._section is Section.TOOL_CALL and self._call_text:
            # Some families close a call with EOS rather than an end marker.
            events.append(self._parse_call())
        elif self._space:
            # No marker followed: the whitespace was the model's text after all.
            kind = ReasoningDelta if self._section is Section.REASONING else TextDelta
            append_text(events, kind(text=self._space))
        self._section, self._space = Section.ANSWER, ""

    def _parse_call(self) -> CompletionEvent:
        text, self._call_text = self._call_text, ""
        parsed = _parse(self._markers, text)
        if parsed is None:
            # Unparseable markup is kept as the text the model wrote.
            start, end = self._markers.tool_call or ("", "")
            return TextDelta(text=f"{start}{text}{end}")
        name, arguments = parsed
        call = ToolCall(index=self._calls, id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments)
        self._calls += 1
        return call


def markers_for(tokenizer: Tokenizer, tools: Sequence[Tool], *, parse_tools: bool) -> Markers:
    """The markers of a request: thinking if the model has it, tools if asked for."""
    think = (tokenizer.think_start, tokenizer.think_end) if tokenizer.think_start and tokenizer.think_end else None
    start, end, parser = tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser
    tool_call = (start, end) if parse_tools and start and end and parser else None
    return Markers(think=think, tool_call=tool_call, tool_parser=parser, tools=tuple(tools))


def _parse(markers: Markers, text: str) -> tuple[str, str] | None:
    if markers.tool_parser is None:
        return None
    schema = [template_tool(tool) for tool in markers.tools]
    try:
        parsed = markers.tool_parser(text, schema)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
        # Whatever the model wrote that the parser cannot read is text, not a call.
        return None
    if isinstance(parsed, list):
        parsed = parsed[0] if len(parsed) == 1 else None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads(arguments)
        except ValueError:  # not JSON, or nested past what is safe to read
            return None
    if not isinstance(arguments, dict):
        return None
    return parsed["name"], json.dumps(arguments, ensure_ascii=False)
