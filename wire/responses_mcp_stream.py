"""The SSE events of a Responses turn with `mcp` tools, made from its output items as each opens and ends.

The edge runs such a turn in rounds (edge/mcp_loop.py) and hands each item here twice: when it
opens and when it is done. The events are OpenAI's, in its order, with one run of sequence
numbers: an `mcp_list_tools` item's `response.mcp_list_tools.in_progress` then `.completed` (or
`.failed`), an `mcp_call`'s `response.mcp_call_arguments.delta|done` and
`response.mcp_call.in_progress` when it opens, `response.mcp_call.completed|failed` when its server
answers; a message's text comes in one `response.output_text.delta` once its round is done.
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
        return frames

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
        """A message's or reasoning's parts: each one's delta, done and part done."""
        message = item.get("type") == "message"
        frames = b""
        content = item.get("content")
        for part_index, part in enumerate(content if isinstance(content, list) else []):
            assert isinstance(part, dict)
            text = part.get("text", "")
            empty: JsonObject = {**part, "text": ""}
            where: JsonObject = {"item_id": _id(item), "output_index": self._index, "content_index": part_index}
            extra: JsonObject = {"logprobs": []} if message else {}
            prefix = "response.output_text" if message else "response.reasoning_text"
            frames += self._event("response.content_part.added", **where, part=empty)
            frames += self._event(f"{prefix}.delta", **where, delta=text, **extra)
            frames += self._event(f"{prefix}.done", **where, text=text, **extra)
            frames += self._event("response.content_part.done", **where, part=part)
        return frames

    def _event(self, event_type: str, **data: JsonValue) -> bytes:
        payload: JsonObject = {"type": event_type, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return frame(payload, event=event_type)


def _id(item: JsonObject) -> str:
    return str(item.get("id"))


def _opened(item: JsonObject) -> JsonObject:
    """An item as `response.output_item.added` shows it: in progress, its content still to come."""
    kind = item.get("type")
    if kind in ("message", "reasoning"):
        return {**item, "status": "in_progress", "content": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return item
