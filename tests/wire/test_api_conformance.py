"""wire/: places where the Responses wire format once departed from OpenAI's API.

Each test states what the real API does: neutral values of unserved
fields are accepted, the requested text format and effort are echoed, and
the item max_output_tokens cut is `incomplete`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.events import FinishReason, ReasoningDelta, Summary, TextDelta, ToolCall, Usage
from pipeline.requests import JsonValue
from wire.responses import ResponsesStream
from wire.responses_requests import decode_responses

SCHEMA: dict[str, JsonValue] = {"type": "object", "properties": {"n": {"type": "integer"}}}
END = Summary(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=5, completion_tokens=3))
CUT = Summary(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=5, completion_tokens=3))


def body(**fields: JsonValue) -> dict[str, JsonValue]:
    return {"model": "m", "input": "hi", **fields}


def stream_for(value: dict[str, JsonValue]) -> ResponsesStream:
    decoded = decode_responses(value)
    return ResponsesStream(
        id="resp_1",
        created_at=0,
        model="m",
        echo=decoded.echo,
        instructions=None,
        previous_response_id=None,
        store=True,
    )


@pytest.mark.parametrize(
    "value",
    [body(background=False), body(top_logprobs=0)],
    ids=["background-false", "top_logprobs-zero"],
)
def test_neutral_values_of_refused_fields_are_accepted(value: JsonValue) -> None:
    """`background: false` and `top_logprobs: 0` change nothing, and OpenAI accepts them; so must we.

    Refusing the field only when it would change the output is the rule the
    Chat decoder already follows (`n: 1`, `echo: false` are accepted).
    """
    assert decode_responses(value) == decode_responses(body())


def test_response_echoes_the_requested_text_format() -> None:
    """The response object's `text.format` is the one the request asked for, not always `text`."""
    requested: dict[str, JsonValue] = {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True}
    final = stream_for(body(text={"format": requested})).body([TextDelta(text='{"n": 1}')], END)
    text = final["text"]
    assert isinstance(text, dict) and isinstance(text["format"], dict)
    assert {key: text["format"].get(key) for key in requested} == requested


def test_response_echoes_the_requested_reasoning_effort() -> None:
    """The response object's `reasoning.effort` is the request's, not always null."""
    final = stream_for(body(reasoning={"effort": "high"})).body([TextDelta(text="x")], END)
    reasoning = final["reasoning"]
    assert isinstance(reasoning, dict) and reasoning["effort"] == "high"


def _done_items(data: bytes) -> list[Any]:
    frames = [json.loads(block.split(b"\n")[1].removeprefix(b"data: ")) for block in data.split(b"\n\n")[:-1]]
    return [frame["item"] for frame in frames if frame["type"] == "response.output_item.done"]


def test_the_item_cut_by_max_output_tokens_is_incomplete() -> None:
    """When max_output_tokens cuts a response, the item being written when it stopped is `incomplete`.

    Items finished before the cut stay `completed`; the output_item.done
    event and the final response agree.
    """
    protocol = stream_for(body(max_output_tokens=3))
    data = protocol.start()
    data += protocol.add_events([ReasoningDelta(text="hm"), ToolCall(index=0, id="call_1", name="f", arguments="{}")])
    data += protocol.add_events([TextDelta(text="cu"), TextDelta(text="t")])
    data += protocol.finish(CUT)
    assert [item["status"] for item in _done_items(data)] == ["completed", "completed", "incomplete"]
    assert protocol.final is not None
    output = protocol.final["output"]
    assert isinstance(output, list)
    assert [item["status"] for item in output if isinstance(item, dict)] == ["completed", "completed", "incomplete"]


def test_the_item_cut_in_a_non_streaming_response_is_incomplete() -> None:
    """The same holds for a non-streaming response."""
    final = stream_for(body(max_output_tokens=3)).body([TextDelta(text="done"), ReasoningDelta(text="cut")], CUT)
    output = final["output"]
    assert isinstance(output, list)
    assert [item["status"] for item in output if isinstance(item, dict)] == ["completed", "incomplete"]
