"""wire/responses.py: completion events → OpenAI Responses SSE events and response objects.

Each test feeds events in and compares every event out, parsed from the
exact bytes (`event:` names the JSON's `type`). Item ids are random, so
they are renamed in order of first appearance (`msg_1`, `rs_1`, `fc_1`):
the comparison then also checks that every event names the right item.
Sequence numbers must run 0, 1, 2, … across the whole stream.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from pipeline.errors import engine_dead, invalid
from pipeline.events import (
    CompletionEvent,
    FinishReason,
    Logprobs,
    ReasoningDelta,
    Summary,
    TextDelta,
    TokenLogprob,
    ToolCall,
)
from pipeline.protocol import StreamProtocol
from tests.wire.responses_expected import (
    Event,
    call_events,
    call_item,
    completed,
    message_events,
    message_item,
    opening,
    parse,
    reasoning_events,
    reasoning_item,
    response,
    stream,
    summary,
    usage_json,
)
from wire.responses_requests import decode_responses

CALL = ToolCall(index=0, id="call_1", name="get_weather", arguments='{"city": "Paris"}')
CALL_2 = ToolCall(index=1, id="call_2", name="now", arguments="{}")
SCORED = Logprobs(chosen=(TokenLogprob(token="Hi", bytes=(72, 105), logprob=-0.1),), top=((),))

STREAMS = [
    pytest.param([], summary(), [completed([])], id="no-output"),
    pytest.param(
        [[TextDelta(text="Hel")], [TextDelta(text="lo")]],
        summary(),
        [*message_events(0, "msg_1", "Hel", "lo"), completed([message_item("msg_1", "completed", "Hello")])],
        id="one-message-across-batches",
    ),
    pytest.param(
        [[ReasoningDelta(text="Think"), ReasoningDelta(text="ing")], [TextDelta(text="Hi")]],
        summary(),
        [
            *reasoning_events(0, "rs_1", "Think", "ing"),
            *message_events(1, "msg_1", "Hi"),
            completed([reasoning_item("rs_1", "completed", "Thinking"), message_item("msg_1", "completed", "Hi")]),
        ],
        id="reasoning-then-message",
    ),
    pytest.param(
        [[TextDelta(text="Checking."), CALL, CALL_2]],
        summary(FinishReason.TOOL_CALLS),
        [
            *message_events(0, "msg_1", "Checking."),
            *call_events(1, "fc_1", CALL),
            *call_events(2, "fc_2", CALL_2),
            completed(
                [
                    message_item("msg_1", "completed", "Checking."),
                    call_item("fc_1", "completed", CALL),
                    call_item("fc_2", "completed", CALL_2),
                ]
            ),
        ],
        id="message-then-function-calls",
    ),
    pytest.param(
        [[CALL], [TextDelta(text="a")], [TextDelta(text="b")]],
        summary(),
        [
            *call_events(0, "fc_1", CALL),
            *message_events(1, "msg_1", "a", "b"),
            completed([call_item("fc_1", "completed", CALL), message_item("msg_1", "completed", "ab")]),
        ],
        id="text-after-a-call-is-a-new-message",
    ),
    pytest.param(
        [[TextDelta(text=""), SCORED, ReasoningDelta(text="")], [TextDelta(text="x"), SCORED]],
        summary(),
        [*message_events(0, "msg_1", "x"), completed([message_item("msg_1", "completed", "x")])],
        id="empty-deltas-and-logprobs-ignored",
    ),
    pytest.param(
        [[TextDelta(text="x")]],
        summary(prompt=100, completion=4, cached=64),
        [
            *message_events(0, "msg_1", "x"),
            completed([message_item("msg_1", "completed", "x")], prompt=100, completion=4, cached=64),
        ],
        id="cached-tokens-in-input_tokens_details",
    ),
]


def run(protocol: StreamProtocol, batches: Sequence[Sequence[CompletionEvent]], end: Summary) -> bytes:
    out = protocol.start()
    for batch in batches:
        out += protocol.add_events(batch)
    return out + protocol.finish(end)


@pytest.mark.parametrize(("batches", "end", "expected"), STREAMS)
def test_stream_events(batches: list[list[CompletionEvent]], end: Summary, expected: list[Event]) -> None:
    """created, in_progress, each item's events in order, then the terminal event; numbered 0..n."""
    assert parse(run(stream(), batches, end)) == opening() + expected


CUT: list[list[CompletionEvent]] = [[ReasoningDelta(text="hm")], [TextDelta(text="cu"), TextDelta(text="t")]]
# Every stream case, plus ones cut short by max_output_tokens.
ENDINGS = [pytest.param(p.values[0], p.values[1], id=str(p.id)) for p in STREAMS] + [
    pytest.param(CUT, summary(FinishReason.LENGTH), id="length"),
    pytest.param([[CALL]], summary(FinishReason.LENGTH), id="length-after-a-call"),
]


@pytest.mark.parametrize(("batches", "end"), ENDINGS)
def test_final_is_the_terminal_events_response(batches: list[list[CompletionEvent]], end: Summary) -> None:
    """`final` (what the app stores) is exactly the response the last event carried."""
    protocol = stream()
    data = run(protocol, batches, end)
    last = json.loads(data.split(b"\n\n")[-2].split(b"\n")[1].removeprefix(b"data: "))
    assert protocol.final == last["response"]


def test_final_is_unset_until_the_stream_finishes() -> None:
    """A stream that has not finished has nothing to store."""
    protocol = stream()
    protocol.start()
    protocol.add_events([TextDelta(text="partial")])
    assert protocol.final is None


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "body"])
def test_length_is_incomplete_with_reason_max_output_tokens(streaming: bool) -> None:
    """A response cut by max_output_tokens ends with response.incomplete and says why; usage is still reported."""
    protocol = stream()
    if streaming:
        events = parse(run(protocol, CUT, summary(FinishReason.LENGTH, cached=2)))
        assert [event["type"] for event in events[-1:]] == ["response.incomplete"]
        assert "response.completed" not in [event["type"] for event in events]
    else:
        protocol.body([event for batch in CUT for event in batch], summary(FinishReason.LENGTH, cached=2))
    assert protocol.final is not None
    assert protocol.final["status"] == "incomplete"
    assert protocol.final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert protocol.final["usage"] == usage_json(cached=2)
    assert protocol.final["output_text"] == "cut"


@pytest.mark.parametrize("reason", [FinishReason.STOP, FinishReason.TOOL_CALLS])
def test_stop_and_tool_calls_are_completed(reason: FinishReason) -> None:
    """Only a cut is incomplete: an ordinary end, with or without calls, is response.completed."""
    protocol = stream()
    events = parse(run(protocol, [[TextDelta(text="x"), CALL]], summary(reason)))
    assert events[-1]["type"] == "response.completed"
    assert protocol.final is not None and protocol.final["incomplete_details"] is None


def test_snapshots_repeat_the_request() -> None:
    """instructions, previous_response_id, store and the echoed fields appear in every response object."""
    decoded = decode_responses(
        {
            "model": "m",
            "input": "hi",
            "instructions": "S",
            "max_output_tokens": 9,
            "store": False,
            "metadata": {"k": "v"},
        }
    )
    protocol = stream(echo=decoded.echo, instructions="S", previous_response_id="resp_0", store=False)
    fields: dict[str, Any] = {
        "instructions": "S",
        "previous_response_id": "resp_0",
        "store": False,
        "max_output_tokens": 9,
        "metadata": {"k": "v"},
    }
    events = parse(run(protocol, [], summary()))
    assert [event["response"] for event in events] == [
        response("in_progress", [], **fields),
        response("in_progress", [], **fields),
        response("completed", [], usage_json(), **fields),
    ]


@pytest.mark.parametrize(
    "batches",
    [[], [[TextDelta(text="par")]], [[TextDelta(text="a"), CALL]]],
    ids=["before-output", "mid-message", "after-a-call"],
)
def test_error_after_partial_stream_is_response_failed(batches: list[list[CompletionEvent]]) -> None:
    """A failure after the stream began ends it with response.failed, numbered on; `final` is that failed
    response, which a background run stores as its end (edge/background.py) and a live one never persists."""
    protocol = stream()
    head = protocol.start()
    for batch in batches:
        head += protocol.add_events(batch)
    count = head.count(b"\n\n")
    error = engine_dead()
    failed = response("failed", [], error={"code": "server_error", "message": error.message})
    assert parse(protocol.error(error), first_sequence=count) == [{"type": "response.failed", "response": failed}]
    assert protocol.final is not None and protocol.final["status"] == "failed"


def test_error_message_is_the_client_message() -> None:
    """The failure carries the RequestError's client-facing message, under code server_error."""
    events = parse(stream().error(invalid("grammar did not compile", param="text.format.schema")))
    assert events[0]["response"]["error"] == {"code": "server_error", "message": "grammar did not compile"}


TRICKY_TEXTS = [
    "plain",
    'quote " and \\ backslash',
    "line\nbreak\ttab",
    "日本 ☕ 🙂",
    "\x00\x1f ctrl",
    "</script>",
    "\u2028",
]


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_spliced_delta_frames_are_the_bytes_the_whole_event_encodes_to(text: str) -> None:
    """Text and reasoning deltas come from a per-item template (wire/sse.Splice) with the sequence number
    and the text spliced in: each frame is byte for byte what encoding the whole event gives."""
    from wire.sse import frame

    s = stream()
    data = s.start() + b"".join(
        s.add_events([event])
        for event in (
            ReasoningDelta(text=text),
            ReasoningDelta(text=text),
            TextDelta(text=text),
            TextDelta(text=text + "!"),
        )
    )
    events = []
    for block in data.split(b"\n\n")[:-1]:
        head, line = block.split(b"\n")
        payload = json.loads(line.removeprefix(b"data: "))
        assert frame(payload, event=head.removeprefix(b"event: ").decode()) == block + b"\n\n"
        events.append(payload)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [(e["type"], e["output_index"], e["delta"]) for e in events if e["type"].endswith("_text.delta")]
    assert deltas == [
        ("response.reasoning_text.delta", 0, text),
        ("response.reasoning_text.delta", 0, text),
        ("response.output_text.delta", 1, text),
        ("response.output_text.delta", 1, text + "!"),
    ]
