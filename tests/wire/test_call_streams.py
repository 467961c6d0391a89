"""A tool call streamed as it is written, in every API's stream protocol: the
call opens once its name is known, its arguments follow in pieces as
OpenAI, Anthropic and the Responses API send them, and the pieces join to
the arguments of the finished call and of the whole body. A call cut off
by max tokens is a call with the arguments written so far."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.events import (
    CompletionEvent,
    FinishReason,
    Summary,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from pipeline.protocol import StreamProtocol
from tests.wire import responses_expected
from tests.wire.test_anthropic import parse as messages_frames
from tests.wire.test_openai_streams import payloads
from wire.anthropic import MessagesStream
from wire.openai import ChatStream
from wire.responses_tools import ToolSpec

PIECES = ('{"city": "Pa', 'ris", "days": ', "3}")
ARGUMENTS = "".join(PIECES)
START = ToolCallStart(index=0, id="call_abc", name="get_weather")
CALL = ToolCall(index=0, id="call_abc", name="get_weather", arguments=ARGUMENTS)
# As the sink sends a call: text, the start, a piece per decode step, then the call.
BATCHES: list[list[CompletionEvent]] = [
    [TextDelta(text="Checking.")],
    [START],
    *[[ToolCallDelta(index=0, arguments=piece)] for piece in PIECES],
    [CALL],
]


def run(protocol: StreamProtocol, batches: Sequence[Sequence[CompletionEvent]], reason: FinishReason) -> bytes:
    out = protocol.start()
    for batch in batches:
        out += protocol.add_events(batch)
    return out + protocol.finish(Summary(finish_reason=reason, usage=Usage(prompt_tokens=5, completion_tokens=9)))


def chat_calls(data: bytes) -> list[dict[str, Any]]:
    chunks = [p for p in payloads(data) if isinstance(p, dict) and p["choices"]]
    return [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or []]  # type: ignore[index, union-attr]


def test_chat_streams_a_call_as_openai_does() -> None:
    calls = chat_calls(run(ChatStream(id="c", created=1, model="m"), BATCHES, FinishReason.TOOL_CALLS))
    head = {"index": 0, "id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    assert calls == [head, *({"index": 0, "function": {"arguments": piece}} for piece in PIECES)]


def test_chat_pieces_of_one_batch_go_in_one_chunk() -> None:
    batch: list[CompletionEvent] = [START, *(ToolCallDelta(index=0, arguments=piece) for piece in PIECES), CALL]
    calls = chat_calls(run(ChatStream(id="c", created=1, model="m"), [batch], FinishReason.TOOL_CALLS))
    assert [call["function"]["arguments"] for call in calls] == ["", ARGUMENTS]


def test_messages_streams_input_json_deltas() -> None:
    frames = messages_frames(run(MessagesStream(id="msg", model="m", input_tokens=5), BATCHES, FinishReason.TOOL_CALLS))
    blocks = [(name, data) for name, data in frames if name.startswith("content_block")]
    tool = [data for _, data in blocks if data["index"] == 1]
    assert tool[0]["content_block"] == {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}
    assert [data["delta"] for data in tool[1:-1]] == [{"type": "input_json_delta", "partial_json": p} for p in PIECES]
    assert tool[-1] == {"type": "content_block_stop", "index": 1}
    assert frames[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_messages_cut_call_keeps_the_input_written_so_far() -> None:
    cut = ToolCall(index=0, id="call_abc", name="get_weather", arguments=PIECES[0] + PIECES[1])
    body = MessagesStream(id="msg", model="m", input_tokens=5).body(
        [START, cut], Summary(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=5, completion_tokens=9))
    )
    assert body["stop_reason"] == "max_tokens"
    # What the SDK's partial JSON reader makes of the pieces: the whole string is kept, the unfinished number is not.
    assert body["content"] == [
        {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}}
    ]


def test_responses_streams_function_call_arguments() -> None:
    events = responses_expected.parse(run(responses_expected.stream(), BATCHES, FinishReason.TOOL_CALLS))
    kinds = [event["type"] for event in events]
    added = [e for e in events if e["type"] == "response.output_item.added"][1]
    assert added["item"]["type"] == "function_call" and added["item"]["arguments"] == ""
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == list(PIECES)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == ARGUMENTS and done["name"] == "get_weather"
    assert kinds.index("response.function_call_arguments.done") > kinds.index("response.function_call_arguments.delta")
    assert events[-1]["response"]["output"][1]["arguments"] == ARGUMENTS


def test_responses_custom_tool_input_streams_decoded() -> None:
    pieces = ('{"input": "*** Be', "gin\\n", 'x\\u00e9"}')
    arguments = "".join(pieces)
    batches: list[list[CompletionEvent]] = [
        [ToolCallStart(index=0, id="call_p", name="apply_patch")],
        *[[ToolCallDelta(index=0, arguments=piece)] for piece in pieces],
        [ToolCall(index=0, id="call_p", name="apply_patch", arguments=arguments)],
    ]
    specs = {"apply_patch": ToolSpec(name="apply_patch", kind="custom")}
    events = responses_expected.parse(
        run(responses_expected.stream(tool_specs=specs), batches, FinishReason.TOOL_CALLS)
    )
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert deltas == ["*** Be", "gin\n", "xé"]
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == "*** Begin\nxé"


def test_responses_cut_call_is_incomplete() -> None:
    cut = ToolCall(index=0, id="call_abc", name="get_weather", arguments=PIECES[0])
    events = responses_expected.parse(
        run(
            responses_expected.stream(),
            [[START], [ToolCallDelta(index=0, arguments=PIECES[0])], [cut]],
            FinishReason.LENGTH,
        )
    )
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = final["response"]["output"]
    assert item["type"] == "function_call" and item["status"] == "incomplete" and item["arguments"] == PIECES[0]
