"""The SSE events of a Responses turn with `mcp` tools, made from its output items as each opens and ends.

The edge runs such a turn in rounds (edge/mcp_loop.py) and hands each item here twice: when it
opens and when it is done. The events are OpenAI's, in its order, with one run of sequence
numbers: an `mcp_list_tools` item's `response.mcp_list_tools.in_progress` then `.completed` (or
`.failed`), an `mcp_call`'s `response.mcp_call_arguments.delta|done` and
`response.mcp_call.in_progress` when it opens, `response.mcp_call.completed|failed` when its server
answers; a message's or reasoning's text as it comes, one `response.output_text.delta` (or
`response.reasoning_text.delta`) a piece (wire/responses_mcp_round.py), between its part's added and done.
"""

from __future__ import annotations

import attrs

from pipeline.requests import JsonObject, JsonValue
from wire.sse import frame


@attrs.define(kw_only=True)
class McpEvents:
    _sequence: int = 0
    _index: int = -1

    def opening(self, snapshot: JsonObject) -> bytes:
        return self._event("response.created", response=snapshot) + self._event(
            "response.in_progress", response=snapshot
        )

    def added(self, item: JsonObject) -> bytes:
        self._index += 1
        kind = item.get("type")
        at = self._index
        if kind == "mcp_call":
            shown: JsonObject = {**item, "arguments": ""}
            arguments = str(item.get("arguments", ""))
            return (
                self._event("response.output_item.added", output_index=at, item=shown)
                + self._event("response.mcp_call.in_progress", item_id=_id(item), output_index=at)
                + self._event("response.mcp_call_arguments.delta", item_id=_id(item), output_index=at, delta=arguments)
                + self._event(
                    "response.mcp_call_arguments.done", item_id=_id(item), output_index=at, arguments=arguments
                )
            )
        frames = self._event("response.output_item.added", output_index=at, item=_opened(item))
        if kind == "mcp_list_tools":
            frames += self._event("response.mcp_list_tools.in_progress", item_id=_id(item), output_index=at)
        elif kind in ("message", "reasoning"):
            frames += self._event("response.content_part.added", **self._where(item), part=_part(kind, ""))
        return frames

    def delta(self, piece: JsonObject) -> bytes:
        """A piece of the open message's or reasoning's text: `piece` is `{"id", "type", "delta"}`."""
        if piece.get("type") == "message":
            return self._event("response.output_text.delta", **self._where(piece), delta=piece["delta"], logprobs=[])
        return self._event("response.reasoning_text.delta", **self._where(piece), delta=piece["delta"])

    def done(self, item: JsonObject) -> bytes:
        kind, at, item_id = item.get("type"), self._index, _id(item)
        frames = b""
        if kind == "mcp_list_tools":
            name = "failed" if item.get("error") is not None else "completed"
            frames = self._event(f"response.mcp_list_tools.{name}", item_id=item_id, output_index=at)
        elif kind == "mcp_call":
            name = "failed" if item.get("error") is not None else "completed"
            frames = self._event(f"response.mcp_call.{name}", item_id=item_id, output_index=at)
        elif kind == "function_call":
            arguments = item.get("arguments", "")
            frames = self._event(
                "response.function_call_arguments.delta", item_id=item_id, output_index=at, delta=arguments
            ) + self._event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=at,
                name=item.get("name"),
                arguments=arguments,
            )
        elif kind in ("message", "reasoning"):
            frames = self._text(item)
        return frames + self._event("response.output_item.done", output_index=at, item=item)

    def closing(self, response: JsonObject) -> bytes:
        name = "response.completed" if response.get("status") == "completed" else "response.incomplete"
        return self._event(name, response=response)

    def failed(self, response: JsonObject) -> bytes:
        return self._event("response.failed", response=response)

    def _text(self, item: JsonObject) -> bytes:
        """The end of a message's or reasoning's one part, whose pieces have gone out as deltas."""
        content = item.get("content")
        part = content[0] if isinstance(content, list) and content else _part(str(item.get("type")), "")
        assert isinstance(part, dict)
        text = part.get("text", "")
        if item.get("type") == "message":
            frames = self._event("response.output_text.done", **self._where(item), text=text, logprobs=[])
        else:
            frames = self._event("response.reasoning_text.done", **self._where(item), text=text)
        return frames + self._event("response.content_part.done", **self._where(item), part=part)

    def _where(self, item: JsonObject) -> JsonObject:
        return {"item_id": _id(item), "output_index": self._index, "content_index": 0}

    def _event(self, event_type: str, **data: JsonValue) -> bytes:
        payload: JsonObject = {"type": event_type, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return frame(payload, event=event_type)


def _id(item: JsonObject) -> str:
    return str(item.get("id"))


def _part(kind: str, text: str) -> JsonObject:
    if kind == "message":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


def _opened(item: JsonObject) -> JsonObject:
    """An item as `response.output_item.added` shows it: in progress, its content still to come."""
    kind = item.get("type")
    if kind in ("message", "reasoning"):
        return {**item, "status": "in_progress", "content": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item
