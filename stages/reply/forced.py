"""A forced call cut off by max tokens before its name: still that call.

When `tool_choice` leaves one tool to call (`ChatRequest.forced_tool`), the
forced grammar makes the whole output that tool's call in the family's
markup, and its first tokens are markup. Cut before the name is whole, the
family's splitter sees no call to end and drops the section, though the name
was never in doubt. `ForcedCall` wraps the family's splitter and ends such a
reply with the forced call, its arguments "" (nothing of them was written), as
the splitter ends a call cut inside its arguments (`stages/families/call_stream.py`).
Pure; no I/O.
"""

from __future__ import annotations

import attrs

from pipeline.events import CompletionEvent, TextDelta, ToolCall, ToolCallStart
from stages.families.base import Splitter
from stages.families.call_stream import call_id


@attrs.define
class ForcedCall:
    """A `Splitter` whose cut output always holds a call: the inner splitter's, else `name`'s."""

    _inner: Splitter = attrs.field(alias="inner")
    # The tool the grammar forces.
    _name: str = attrs.field(alias="name")
    # A call has started or ended: the inner splitter ends it, cut or not.
    _called: bool = attrs.field(default=False, init=False)
    # The forced call was added here, not by the inner splitter.
    _added: bool = attrs.field(default=False, init=False)

    @property
    def reasoning(self) -> bool:
        return self._inner.reasoning

    @property
    def tool_calls(self) -> int:
        return self._inner.tool_calls + self._added

    def feed(self, text: str, *, final: bool = False, cut: bool = False) -> list[CompletionEvent]:
        """The inner splitter's events; with `final` and `cut` and no call yet, the forced call instead
        of any text: under the grammar, text there is the call's markup cut short."""
        events = self._inner.feed(text, final=final, cut=cut)
        if self._called or any(isinstance(event, (ToolCallStart, ToolCall)) for event in events):
            self._called = True
            return events
        if not (final and cut):
            return events
        self._called = self._added = True
        kept = [event for event in events if not isinstance(event, TextDelta)]
        return [*kept, ToolCall(index=0, id=call_id(), name=self._name, arguments="")]
