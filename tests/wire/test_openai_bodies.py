"""wire/openai.py: non-streaming chat.completion and text_completion bodies.

The frame-by-frame stream tables and the error bodies are in test_openai_streams.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.events import CompletionEvent, FinishReason, ReasoningDelta, Summary, TextDelta
from tests.wire.test_openai_streams import CALL_0, CALL_1, CREATED, ID, MODEL, deltas, summary, usage_json
from wire.openai import ChatStream, TextStream

MESSAGE_CALL_0 = {
    "id": "call_a",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
MESSAGE_CALL_1 = {"id": "call_b", "type": "function", "function": {"name": "ping", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("events", "end", "content"),
    [
        pytest.param(deltas("Hello", " world"), summary(prompt=5, completion=2), "Hello world", id="text"),
        pytest.param([], summary(FinishReason.LENGTH, prompt=9, completion=0), "", id="empty"),
        pytest.param(deltas("a", "", "b"), summary(prompt=0, completion=3), "ab", id="empty-deltas"),
        pytest.param(deltas("x"), summary(prompt=12, completion=1, cached=8), "x", id="cached-prompt-tokens"),
    ],
)
def test_chat_body(events: list[CompletionEvent], end: Summary, content: str) -> None:
    """A non-streaming chat reply is one chat.completion object with usage totals."""
    body = ChatStream(id=ID, created=CREATED, model=MODEL, include_usage=True).body(events, end)
    usage = end.usage
    assert body == {
        "id": ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": end.finish_reason.value,
            }
        ],
        "usage": usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens),
    }


@pytest.mark.parametrize("include_usage", [False, True], ids=["plain", "include_usage"])
def test_text_body(include_usage: bool) -> None:
    """A non-streaming completion is one text_completion object; usage is always present."""
    end = summary(FinishReason.LENGTH, prompt=4, completion=16)
    body = TextStream(id=ID, created=CREATED, model=MODEL, include_usage=include_usage).body(
        deltas("Once", " upon"), end
    )
    assert body == {
        "id": ID,
        "object": "text_completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "text": "Once upon", "logprobs": None, "finish_reason": "length"}],
        "usage": usage_json(4, 16),
    }


@pytest.mark.parametrize(
    ("events", "message"),
    [
        pytest.param(
            [ReasoningDelta(text="2+2"), ReasoningDelta(text="=4"), TextDelta(text="4")],
            {"role": "assistant", "content": "4", "refusal": None, "reasoning_content": "2+2=4", "reasoning": "2+2=4"},
            id="reasoning",
        ),
        pytest.param(
            [CALL_0, CALL_1],
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [MESSAGE_CALL_0, MESSAGE_CALL_1],
            },
            id="only-tool-calls-content-null",
        ),
        pytest.param(
            [TextDelta(text="Checking."), CALL_1],
            {
                "role": "assistant",
                "content": "Checking.",
                "refusal": None,
                "tool_calls": [MESSAGE_CALL_1],
            },
            id="text-and-tool-call",
        ),
    ],
)
def test_chat_body_message_with_reasoning_and_tools(events: list[CompletionEvent], message: dict[str, Any]) -> None:
    """The non-streaming message carries reasoning under both names, and tool calls.

    Its content is null only when the reply is calls alone.
    """
    body = ChatStream(id=ID, created=CREATED, model=MODEL).body(events, summary(FinishReason.TOOL_CALLS))
    choices = body["choices"]
    assert isinstance(choices, list)
    assert choices[0] == {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
