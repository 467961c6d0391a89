"""wire/responses.py: non-streaming Responses bodies, and streams that add up to the same object.

The event-by-event stream tables are in test_responses.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.events import CompletionEvent, FinishReason, ReasoningDelta, Summary, TextDelta, Usage
from pipeline.requests import JsonValue
from tests.wire.responses_expected import (
    Renamer,
    call_item,
    message_item,
    reasoning_item,
    response,
    stream,
    summary,
    text_part,
    usage_json,
)
from tests.wire.test_responses import CALL, CALL_2, ENDINGS, SCORED, run
from wire.responses import output_items, output_text, usage_body

BODIES = [
    pytest.param([], summary(), response("completed", [], usage_json()), id="empty"),
    pytest.param(
        [ReasoningDelta(text="hm"), TextDelta(text="Hel"), SCORED, TextDelta(text="lo"), CALL],
        summary(FinishReason.TOOL_CALLS),
        response(
            "completed",
            [
                reasoning_item("rs_1", "completed", "hm"),
                message_item("msg_1", "completed", "Hello"),
                call_item("fc_1", "completed", CALL),
            ],
            usage_json(),
        ),
        id="every-item-kind",
    ),
]


@pytest.mark.parametrize(("events", "end", "expected"), BODIES)
def test_body(events: list[CompletionEvent], end: Summary, expected: dict[str, Any]) -> None:
    """A non-streaming response is the same object the stream's terminal event carries; it is `final`."""
    protocol = stream()
    body = protocol.body(events, end)
    assert Renamer()(body) == expected
    assert protocol.final == body


@pytest.mark.parametrize(("batches", "end"), ENDINGS)
def test_stream_and_body_agree(batches: list[list[CompletionEvent]], end: Summary) -> None:
    """Streaming and non-streaming build the same response object, ids aside."""
    streamed = stream()
    run(streamed, batches, end)
    events = [event for batch in batches for event in batch]
    assert Renamer()(streamed.final) == Renamer()(stream().body(events, end))


def test_output_items_ids_are_unique_per_item() -> None:
    """Every output item gets its own id, with the prefix of its kind."""
    output = output_items([ReasoningDelta(text="a"), TextDelta(text="b"), CALL, CALL_2, TextDelta(text="c")])
    ids = [str(item["id"]) for item in output]
    assert [i.split("_")[0] for i in ids] == ["rs", "msg", "fc", "fc", "msg"]
    assert len(set(ids)) == len(ids)


OUTPUT_TEXTS = [
    pytest.param([], "", id="empty"),
    pytest.param(
        [
            message_item("msg_1", "completed", "a"),
            reasoning_item("rs_1", "completed", "no"),
            call_item("fc_1", "completed", CALL),
        ],
        "a",
        id="only-message-text",
    ),
    pytest.param(
        [message_item("msg_1", "completed", "a"), message_item("msg_2", "completed", "b")], "ab", id="messages-joined"
    ),
    pytest.param(
        [
            {"type": "message", "content": [{"type": "refusal", "refusal": "no"}, text_part("y")]},
            "junk",
            {"type": "message"},
        ],
        "y",
        id="other-parts-and-malformed-items-skipped",
    ),
]


@pytest.mark.parametrize(("output", "expected"), OUTPUT_TEXTS)
def test_output_text(output: list[JsonValue], expected: str) -> None:
    """output_text is every output_text part of every message item, joined, as the SDK computes it."""
    assert output_text(output) == expected


def test_usage_body() -> None:
    """Usage counts cached prompt tokens under input_tokens_details; the totals add up."""
    assert usage_body(Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=6)) == usage_json(10, 4, 6)
