"""One round of a Responses turn with `mcp` tools, as output items that open, grow and end while it runs.

A round's text and reasoning reach the client token by token: each run of one kind is an item
opened on its first piece ("added"), grown by each piece ("delta") and finished when the other
kind starts or the round ends ("done"). Calls are held until the round ends: the edge turns a call
of an MCP tool into an `mcp_call` or an `mcp_approval_request` (edge/mcp_loop.py), so its item
cannot be shown before it is whole. Pure (docs/STYLE.md, "Pure wire").
"""

from __future__ import annotations

import uuid
from typing import Literal

import attrs

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import JsonObject
from wire.responses import Specs, output_items

Phase = Literal["added", "delta", "done"]
# ("delta", {"id", "type", "delta"}) for a piece of an open item; the item itself otherwise.
Step = tuple[Phase, JsonObject]


@attrs.define(kw_only=True)
class RoundItems:
    """Feed a round's events in order; `end` closes the open item and gives the held calls as items."""

    specs: Specs
    _open: JsonObject | None = None
    _text: str = ""
    _calls: list[CompletionEvent] = attrs.field(factory=list)
    _call_last: bool = False

    def feed(self, event: CompletionEvent) -> list[Step]:
        if isinstance(event, ToolCall):
            self._calls.append(event)
            self._call_last = True
            return []
        if not isinstance(event, (TextDelta, ReasoningDelta)) or not event.text:
            return []
        self._call_last = False
        kind = "reasoning" if isinstance(event, ReasoningDelta) else "message"
        steps: list[Step] = []
        if self._open is not None and self._open["type"] != kind:
            steps.append(("done", self._finished(cut=False)))
        if self._open is None:
            self._open = _shell(kind)
            steps.append(("added", self._open))
        self._text += event.text
        steps.append(("delta", {"id": self._open["id"], "type": kind, "delta": event.text}))
        return steps

    def end(self, *, cut: bool) -> tuple[list[Step], list[JsonObject]]:
        """The open item's "done", and the held calls; with `cut`, the round's last item was cut short."""
        closing: list[Step] = []
        if self._open is not None:
            closing.append(("done", self._finished(cut=cut and not self._call_last)))
        calls = output_items(self._calls, cut=cut and self._call_last, specs=self.specs) if self._calls else []
        return closing, calls

    def _finished(self, *, cut: bool) -> JsonObject:
        assert self._open is not None
        item, text = self._open, self._text
        self._open, self._text = None, ""
        status = "incomplete" if cut else "completed"
        if item["type"] == "message":
            part: JsonObject = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        else:
            part = {"type": "reasoning_text", "text": text}
        return {**item, "status": status, "content": [part]}


def _shell(kind: str) -> JsonObject:
    """An item as `response.output_item.added` shows it: in progress, its content still to come."""
    if kind == "message":
        return {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex}",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
    return {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [], "content": [], "status": "in_progress"}
