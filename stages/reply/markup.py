"""The model's output markup: answer text, reasoning, and tool calls.

`MarkupSplitter` reads decoded text (after stop strings are applied) and
splits it into completion events by the markup of the model's family
(`stages/families/`): reasoning goes to `ReasoningDelta`, each call
section is parsed by the family's parser into `ToolCall`s, layout markers
(message headers, the brackets around a list of calls) are removed, and
the rest is `TextDelta`. Like the stop matcher it holds back only a suffix
that could still become a marker, so no marker is ever streamed as text.
Pure; no I/O.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence

import attrs

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, append_text
from pipeline.requests import Tool
from stages.families.base import Family, Splitter, in_json_string
from stages.families.call_stream import CallStream, final_arguments
from stages.stops import hold_back


class Section(enum.Enum):
    ANSWER = "answer"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"


@attrs.frozen(kw_only=True)
class Markers:
    """What to look for in one request's output; None disables a kind."""

    think: tuple[str, str] | None = None
    # The family whose calls are parsed; None when the request has no tools.
    family: Family | None = None
    tools: tuple[Tool, ...] = ()


@attrs.define
class MarkupSplitter:
    _markers: Markers = attrs.field(alias="markers")
    # The template may open the reasoning section itself (the prompt ends in `<think>`).
    _section: Section = attrs.field(default=Section.ANSWER, alias="section")
    _held: str = attrs.field(default="", init=False)
    _opener: str = attrs.field(default="", init=False)
    _closer: str | None = attrs.field(default=None, init=False)
    _call_text: str = attrs.field(default="", init=False)
    _calls: int = attrs.field(default=0, init=False)
    _call_stream: CallStream = attrs.field(factory=CallStream, init=False)
    # At the start of a message (only whitespace since): where `leading` openers count.
    _boundary: bool = attrs.field(default=True, init=False)
    # Whitespace next to a marker is layout, not content: it is dropped
    # after one, and held back until the next text shows none follows.
    _trim_next: bool = attrs.field(init=False)
    _space: str = attrs.field(default="", init=False)
    _plain: bool = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._trim_next = self._section is not Section.ANSWER
        # Nothing to look for (a raw completion's text): each token's text goes straight out, per token.
        self._plain = self._markers.think is None and self._markers.family is None and self._section is Section.ANSWER

    @property
    def reasoning(self) -> bool:
        """Inside the think markers now."""
        return self._section is Section.REASONING

    @property
    def tool_calls(self) -> int:
        return self._calls

    def feed(self, text: str, *, final: bool = False, cut: bool = False) -> list[CompletionEvent]:
        """The events that `text` completes; with `final`, nothing is held back;
        with `cut`, the output ended at max tokens rather than where the model ended it."""
        events: list[CompletionEvent] = []
        if self._plain:
            # No marker can follow, so no whitespace is layout: it goes out as it comes. Held until the next word, a
            # completion that opens with "\n\n" (as SmolLM2's mostly do) gave its first text two decode steps late.
            if text:
                append_text(events, TextDelta(text=text))
            return events
        buffer, self._held = self._held + text, ""
        while buffer:
            if self._section is Section.ANSWER and self._boundary and self._leading():
                rest = self._open_leading(buffer, final=final)
                if rest is None:
                    self._held = buffer
                    break
                if rest is not buffer:
                    buffer = rest
                    continue
            markers = self._markers_here()
            found = _first(buffer, markers)
            if found is not None and not final and self._may_grow(buffer[found[0] :], markers):
                self._emit(buffer[: found[0]], events)
                self._held = buffer[found[0] :]
                break
            if found is None:
                ready, self._held = hold_back(buffer, markers, final=final)
                self._emit(ready, events)
                break
            index, marker = found
            if self._section is Section.TOOL_CALL and self._inside_call(marker, self._call_text + buffer[:index]):
                # A marker inside an unfinished call, or inside one of its JSON strings, is part of its arguments.
                self._emit(buffer[:index], events)
                self._call_text += marker
                self._trim_next = False
                buffer = buffer[index + len(marker) :]
                continue
            self._emit(buffer[:index], events)
            buffer = buffer[index + len(marker) :]
            self._cross(marker, events)
        if final:
            self._flush(events, cut=cut)
        elif self._section is Section.TOOL_CALL:
            self._stream_call(events)
        return events

    def _stream_call(self, events: list[CompletionEvent]) -> None:
        family = self._markers.family
        if family is None or family.progress is None:
            return
        try:
            progress = family.progress(self._opener, self._call_text, self._markers.tools)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
            return
        self._call_stream.update(progress, events)

    def _inside_call(self, marker: str, body: str) -> bool:
        family = self._markers.family
        if marker != self._closer:
            return self._parsed(body) is None
        if family is not None and family.closer_inside is not None:
            return family.closer_inside(self._opener, body)
        return family is not None and family.json_bodies and in_json_string(body)

    def _leading(self) -> tuple[str, ...]:
        family = self._markers.family
        return family.leading if family is not None else ()

    def _open_leading(self, buffer: str, *, final: bool) -> str | None:
        """At a boundary: the text after a leading opener, `buffer` itself if none opens, or None to wait."""
        stripped = buffer.lstrip()
        hit = next((opener for opener in self._leading() if stripped.startswith(opener)), None)
        if hit is not None:
            self._open_call(hit, None)
            return stripped[len(hit) :]
        if not final and (not stripped or any(opener.startswith(stripped) for opener in self._leading())):
            return None
        self._boundary = False
        return buffer

    def _markers_here(self) -> list[str]:
        """The markers that end the current section or open another."""
        think, family = self._markers.think, self._markers.family
        if self._section is Section.REASONING:
            return [think[1], *(family.reasoning_openers if family else ())] if think else []
        if self._section is Section.TOOL_CALL:
            return [self._closer] if self._closer else [opener for opener, _ in family.calls] if family else []
        markers = [think[0]] if think else []
        if family is not None:
            markers += [opener for opener, _ in family.calls] + list(family.dropped)
        return markers

    def _may_grow(self, tail: str, markers: list[str]) -> bool:
        """`tail` is a whole marker that is also the start of a longer one."""
        return any(len(marker) > len(tail) and marker.startswith(tail) for marker in markers)

    def _cross(self, marker: str, events: list[CompletionEvent]) -> None:
        think, family = self._markers.think, self._markers.family
        if self._section is Section.TOOL_CALL:
            events.extend(self._parse_call())
            self._section = Section.ANSWER
            if marker != self._closer:
                self._cross(marker, events)
                return
        elif self._section is Section.REASONING:
            self._section, self._boundary = Section.ANSWER, True
            if think is not None and marker != think[1]:
                # A call opener ended the reasoning: it opens its call. The whitespace
                # held at the reasoning's end is dropped, as at its end marker.
                self._space = ""
                self._cross(marker, events)
                return
        elif think is not None and marker == think[0]:
            self._section = Section.REASONING
        elif family is not None and marker in family.dropped:
            self._boundary = True
        elif family is not None:
            self._open_call(marker, dict(family.calls)[marker])
        if family is not None and family.inline_calls and any(marker in pair for pair in family.calls):
            # Calls written inside the text (Gemma 4): the whitespace beside them is the model's, in its place.
            if self._space:
                append_text(events, TextDelta(text=self._space))
            self._trim_next, self._space = False, ""
            return
        self._trim_next, self._space = True, ""

    def _open_call(self, opener: str, closer: str | None) -> None:
        self._section, self._opener, self._closer, self._call_text = Section.TOOL_CALL, opener, closer, ""
        self._boundary = False

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
        if self._section is Section.ANSWER:
            self._boundary = False
        text, self._space = self._space + body, text[len(body) :]
        kind = ReasoningDelta if self._section is Section.REASONING else TextDelta
        append_text(events, kind(text=text))

    def _flush(self, events: list[CompletionEvent], *, cut: bool) -> None:
        if self._section is Section.TOOL_CALL:
            # Some families close a call with EOS rather than an end marker; with
            # an end marker, the output was cut inside the call.
            ended = self._closer is not None
            if self._closed_as_text():
                # Unless the output ends in that marker, read as text inside a value: it closed the call
                # after all, and is in the call's text already.
                ended, self._closer = False, ""
            events.extend(self._parse_call(ended=ended, cut=cut))
        elif self._space:
            # No marker followed: the whitespace was the model's text after all.
            kind = ReasoningDelta if self._section is Section.REASONING else TextDelta
            append_text(events, kind(text=self._space))
        self._section, self._space = Section.ANSWER, ""

    def _closed_as_text(self) -> bool:
        """The call's text ends in its section's closer (which its family read as text inside a value)."""
        family = self._markers.family
        if family is None or family.closer_inside is None or not self._closer:
            return False
        return self._call_text.rstrip().endswith(self._closer)

    def _parsed(self, body: str) -> list[tuple[str, str]] | None:
        family = self._markers.family
        if family is None:
            return None
        try:
            calls = family.parse(self._opener, body, self._markers.tools)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError):
            return None
        if not calls:
            return None
        return [(name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in calls]

    def _parse_call(self, *, ended: bool = False, cut: bool = False) -> list[CompletionEvent]:
        """The events that end a call section: `ended`, the output ended inside it; `cut`, at max tokens."""
        events: list[CompletionEvent] = []
        self._stream_call(events)
        text, self._call_text = self._call_text, ""
        stream, self._call_stream = self._call_stream, CallStream(first=self._calls)
        family = self._markers.family
        # Where only its closer says a call is whole, a section the output ended inside holds none whole.
        unclosed = ended and family is not None and not family.unclosed_calls
        parsed = None if unclosed else self._parsed(text)
        if parsed is None and not (cut and stream.started):
            # Unparseable markup is kept as the text the model wrote; a call the output ended inside
            # is dropped, so no markup leaks. (A start already streamed stays the stream's alone.)
            kept = text.strip() and not ended and not cut and not stream.started
            return events + [TextDelta(text=f"{self._opener}{text}{self._closer or ''}")] if kept else events
        if parsed is not None and family is not None and family.progress is not None:
            parsed = final_arguments(family.progress(self._opener, text, self._markers.tools), parsed)
        self._calls += stream.finish(parsed, events)
        self._call_stream = CallStream(first=self._calls)
        return events


def splitter_for(family: Family, markers: Markers, section: Section = Section.ANSWER) -> Splitter:
    """The splitter for a request's output: the family's own, else markers in text."""
    if family.splitter is not None:
        return family.splitter(markers.tools, markers.family is not None)
    return MarkupSplitter(markers, section=section)


def markers_for(family: Family, tools: Sequence[Tool], *, parse_tools: bool, forced: bool = False) -> Markers:
    """The markers of a request: thinking if the model has it, tools if asked for.

    A family with no call markup (plain JSON) parses calls only when forced.
    """
    calls = parse_tools and (family.auto_calls or forced)
    return Markers(think=family.think, family=family if calls else None, tools=tuple(tools))


def _first(buffer: str, markers: Sequence[str]) -> tuple[int, str] | None:
    """The earliest marker in `buffer`; of two at one place, the longer."""
    found = [(buffer.find(marker), marker) for marker in markers if marker and marker in buffer]
    return min(found, key=lambda hit: (hit[0], -len(hit[1])), default=None)
