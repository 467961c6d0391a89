"""Expected Responses events and objects for tests/wire/test_responses.py, and the stream parser that
renames random item ids (`msg_1`, `rs_1`, `fc_1`) and checks sequence numbers."""

from __future__ import annotations

import json
import re
from typing import Any

from pipeline.events import FinishReason, Summary, ToolCall, Usage
from wire.responses import ResponsesStream
from wire.responses_requests import decode_responses

ID, CREATED, MODEL = "resp_1", 1_700_000_000, "mlx-relay/tiny"
_ITEM_ID = re.compile(r"^(msg|rs|fc)_[0-9a-f]{32}$")
Event = dict[str, Any]


def stream(**fields: Any) -> ResponsesStream:
    defaults: dict[str, Any] = {
        "echo": decode_responses({"model": "m", "input": "hi"}).echo,
        "instructions": None,
        "previous_response_id": None,
        "store": True,
    }
    return ResponsesStream(id=ID, created_at=CREATED, model=MODEL, **(defaults | fields))


class Renamer:
    """Maps random item ids to `<prefix>_<n>`, n counting each prefix's ids in order of appearance."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: self(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self(item) for item in value]
        if isinstance(value, str) and _ITEM_ID.match(value):
            prefix = value.split("_")[0]
            count = sum(name.startswith(prefix + "_") for name in self.names.values())
            return self.names.setdefault(value, f"{prefix}_{count + 1}")
        return value


def parse(data: bytes, first_sequence: int = 0) -> list[Event]:
    """The frames' JSON, with item ids renamed and sequence numbers checked and removed."""
    assert data.endswith(b"\n\n"), data
    found: list[Event] = []
    for block in data.split(b"\n\n")[:-1]:
        head, line = block.split(b"\n")
        assert head.startswith(b"event: ") and line.startswith(b"data: "), block
        payload = json.loads(line.removeprefix(b"data: "))
        assert payload["type"] == head.removeprefix(b"event: ").decode()
        found.append(payload)
    assert [event.pop("sequence_number") for event in found] == list(range(first_sequence, first_sequence + len(found)))
    rename = Renamer()
    return [rename(event) for event in found]


def summary(reason: FinishReason = FinishReason.STOP, prompt: int = 5, completion: int = 3, cached: int = 0) -> Summary:
    return Summary(
        finish_reason=reason, usage=Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    )


def usage_json(prompt: int = 5, completion: int = 3, cached: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response(status: str, output: list[Any], usage: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": ID,
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": MODEL,
        "output": output,
        "output_text": "".join(
            part["text"] for item in output if item["type"] == "message" for part in item["content"]
        ),
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "background": False,
        "text": {"format": {"type": "text"}},
        "max_output_tokens": None,
        "max_tool_calls": None,
        "temperature": None,
        "top_p": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
    }
    # OpenAI's schema: no `usage` until there is some, and no `user` when unset.
    return body | ({} if usage is None else {"usage": usage}) | fields


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, status: str, text: str | None = None) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def reasoning_item(item_id: str, status: str, text: str | None = None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def call_item(item_id: str, status: str, call: ToolCall) -> dict[str, Any]:
    arguments = call.arguments if status == "completed" else ""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def opening() -> list[Event]:
    snapshot = response("in_progress", [])
    return [{"type": "response.created", "response": snapshot}, {"type": "response.in_progress", "response": snapshot}]


def message_events(index: int, item_id: str, *parts: str) -> list[Event]:
    where = {"item_id": item_id, "output_index": index, "content_index": 0}
    full = "".join(parts)
    return [
        {"type": "response.output_item.added", "output_index": index, "item": message_item(item_id, "in_progress")},
        {"type": "response.content_part.added", **where, "part": text_part("")},
        *({"type": "response.output_text.delta", **where, "delta": part, "logprobs": []} for part in parts),
        {"type": "response.output_text.done", **where, "text": full, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": text_part(full)},
        {"type": "response.output_item.done", "output_index": index, "item": message_item(item_id, "completed", full)},
    ]


def reasoning_events(index: int, item_id: str, *parts: str) -> list[Event]:
    where = {"item_id": item_id, "output_index": index, "content_index": 0}
    full = "".join(parts)
    return [
        {"type": "response.output_item.added", "output_index": index, "item": reasoning_item(item_id, "in_progress")},
        {"type": "response.content_part.added", **where, "part": {"type": "reasoning_text", "text": ""}},
        *({"type": "response.reasoning_text.delta", **where, "delta": part} for part in parts),
        {"type": "response.reasoning_text.done", **where, "text": full},
        {"type": "response.content_part.done", **where, "part": {"type": "reasoning_text", "text": full}},
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": reasoning_item(item_id, "completed", full),
        },
    ]


def call_events(index: int, item_id: str, call: ToolCall) -> list[Event]:
    where = {"item_id": item_id, "output_index": index}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": call_item(item_id, "in_progress", call)},
        {"type": "response.function_call_arguments.delta", **where, "delta": call.arguments},
        {"type": "response.function_call_arguments.done", **where, "name": call.name, "arguments": call.arguments},
        {"type": "response.output_item.done", "output_index": index, "item": call_item(item_id, "completed", call)},
    ]


def completed(output: list[Any], **usage: Any) -> Event:
    return {"type": "response.completed", "response": response("completed", output, usage_json(**usage))}
