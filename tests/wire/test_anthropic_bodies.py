"""wire/anthropic.py: error statuses and bodies, and non-streaming message bodies.

The event-by-event stream tables are in test_anthropic.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError, engine_dead, invalid, overloaded, shutting_down
from pipeline.events import CompletionEvent, FinishReason, ReasoningDelta, Summary, TextDelta
from tests.wire.test_anthropic import (
    ID,
    MODEL,
    SCORED,
    STREAMS,
    call,
    parse,
    run,
    stream,
    summary,
    usage_json,
)
from wire.anthropic import error_body, error_status

ERRORS = [
    pytest.param(invalid("messages: Field required", param="messages"), 400, "invalid_request_error", id="invalid"),
    pytest.param(
        RequestError(kind=ErrorKind.NOT_FOUND, message="no such model"), 404, "not_found_error", id="not-found"
    ),
    pytest.param(
        RequestError(kind=ErrorKind.METHOD_NOT_ALLOWED, message="GET"), 405, "invalid_request_error", id="method"
    ),
    pytest.param(overloaded(2.0), 529, "overloaded_error", id="overloaded"),
    pytest.param(shutting_down(), 529, "overloaded_error", id="shutting-down"),
    pytest.param(engine_dead(), 529, "overloaded_error", id="engine-dead"),
    pytest.param(RequestError(kind=ErrorKind.INTERNAL, message="boom"), 500, "api_error", id="internal"),
]


@pytest.mark.parametrize(("error", "status", "error_type"), ERRORS)
def test_error_status_and_body(error: RequestError, status: int, error_type: str) -> None:
    """Each error kind maps to Anthropic's status and error type; the body carries only the client message."""
    assert error_status(error) == status
    assert error_body(error) == {"type": "error", "error": {"type": error_type, "message": error.message}}
    assert parse(stream().error(error)) == [("error", error_body(error))]


def test_every_error_kind_has_an_anthropic_status() -> None:
    """A new ErrorKind cannot reach the Messages error handler unmapped."""
    for kind in ErrorKind:
        assert error_status(RequestError(kind=kind, message="x")) >= 400


def message_body(
    content: list[Any], stop_reason: str, stop_sequence: str | None = None, **usage: Any
) -> dict[str, Any]:
    return {
        "id": ID,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage_json(**usage),
    }


BODIES = [
    pytest.param([], summary(), message_body([], "end_turn"), id="empty"),
    pytest.param(
        [TextDelta(text="Hel"), SCORED, TextDelta(text="lo"), TextDelta(text="")],
        summary(),
        message_body([{"type": "text", "text": "Hello"}], "end_turn"),
        id="text-run-one-block-logprobs-ignored",
    ),
    pytest.param(
        [ReasoningDelta(text="Think"), ReasoningDelta(text="ing"), TextDelta(text="Hi")],
        summary(FinishReason.LENGTH),
        message_body(
            [{"type": "thinking", "thinking": "Thinking", "signature": ""}, {"type": "text", "text": "Hi"}],
            "max_tokens",
        ),
        id="thinking-then-text",
    ),
    pytest.param(
        [TextDelta(text="Checking."), call(), call(1, "call_b", "now", "")],
        summary(FinishReason.TOOL_CALLS),
        message_body(
            [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_b", "name": "now", "input": {}},
            ],
            "tool_use",
        ),
        id="tool_use-input-parsed",
    ),
    pytest.param(
        [call(), TextDelta(text="ok")],
        summary(),
        message_body(
            [
                {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "text", "text": "ok"},
            ],
            "end_turn",
        ),
        id="text-after-tool_use-new-block",
    ),
    pytest.param(
        [TextDelta(text="x")],
        summary(stop="END", prompt=50, completion=2, cached=32),
        message_body([{"type": "text", "text": "x"}], "stop_sequence", "END", input_tokens=18, output=2, cached=32),
        id="stop_sequence-and-cache-reads",
    ),
]


@pytest.mark.parametrize(("events", "end", "expected"), BODIES)
def test_body(events: list[CompletionEvent], end: Summary, expected: dict[str, Any]) -> None:
    """A non-streaming message holds the same blocks the stream would have built."""
    assert stream().body(events, end) == expected


@pytest.mark.parametrize(
    ("batches", "end"), [(p.values[0], p.values[1]) for p in STREAMS], ids=[str(p.id) for p in STREAMS]
)
def test_stream_and_body_build_the_same_message(batches: list[list[CompletionEvent]], end: Summary) -> None:
    """Accumulating the stream's deltas gives the non-streaming body's content (tool inputs parsed)."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for name, data in parse(run(stream(), batches, end)):
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            change, block = data["delta"], blocks[data["index"]]
            if change["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + change["partial_json"]
            elif change["type"] != "signature_delta":
                key = change["type"].removesuffix("_delta")
                block[key] += change[key]
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    events = [event for batch in batches for event in batch]
    assert blocks == stream().body(events, end)["content"]
