"""wire/anthropic.py: completion events → Anthropic Messages SSE events (bodies and errors: test_anthropic_bodies.py).

`MessagesStream` does no I/O, so each test feeds events in and compares the
events out, parsed from the exact bytes: every frame is an `event:` line
naming the same type as its JSON `data:` line, then a blank line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from pipeline.errors import RequestError, engine_dead, invalid, overloaded, shutting_down
from pipeline.events import (
    CompletionEvent,
    FinishReason,
    Logprobs,
    ReasoningDelta,
    Summary,
    TextDelta,
    TokenLogprob,
    ToolCall,
    Usage,
)
from pipeline.protocol import StreamProtocol
from wire.anthropic import MessagesStream, error_body

ID, MODEL = "msg_1", "mlx-relay/tiny"
Event = tuple[str, dict[str, Any]]


def parse(data: bytes) -> list[Event]:
    """Each SSE frame in `data` as (event name, JSON data); the two must agree on the type."""
    if not data:
        return []
    assert data.endswith(b"\n\n"), data
    found: list[Event] = []
    for block in data.split(b"\n\n")[:-1]:
        head, line = block.split(b"\n")
        assert head.startswith(b"event: ") and line.startswith(b"data: "), block
        name, payload = head.removeprefix(b"event: ").decode(), json.loads(line.removeprefix(b"data: "))
        assert payload["type"] == name, block
        found.append((name, payload))
    return found


def stream(input_tokens: int = 7) -> MessagesStream:
    return MessagesStream(id=ID, model=MODEL, input_tokens=input_tokens)


def summary(
    reason: FinishReason = FinishReason.STOP,
    *,
    prompt: int = 7,
    completion: int = 3,
    cached: int = 0,
    stop: str | None = None,
) -> Summary:
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    return Summary(finish_reason=reason, usage=usage, stop_sequence=stop)


def usage_json(input_tokens: int = 7, output: int = 3, cached: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def block_start(index: int, block: dict[str, Any]) -> Event:
    return "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}


def delta(index: int, **fields: Any) -> Event:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": fields}


def block_stop(index: int) -> Event:
    return "content_block_stop", {"type": "content_block_stop", "index": index}


def text_block(index: int, *parts: str) -> list[Event]:
    return [
        block_start(index, {"type": "text", "text": ""}),
        *(delta(index, type="text_delta", text=part) for part in parts),
        block_stop(index),
    ]


def thinking_block(index: int, *parts: str) -> list[Event]:
    return [
        block_start(index, {"type": "thinking", "thinking": "", "signature": ""}),
        *(delta(index, type="thinking_delta", thinking=part) for part in parts),
        delta(index, type="signature_delta", signature=""),
        block_stop(index),
    ]


def tool_block(index: int, tool_id: str, name: str, arguments: str) -> list[Event]:
    return [
        block_start(index, {"type": "tool_use", "id": tool_id, "name": name, "input": {}}),
        delta(index, type="input_json_delta", partial_json=arguments),
        block_stop(index),
    ]


def ending(stop_reason: str, stop_sequence: str | None = None, **usage: Any) -> list[Event]:
    return [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": usage_json(**usage),
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def call(
    index: int = 0, id: str = "call_abc", name: str = "get_weather", arguments: str = '{"city": "Paris"}'
) -> ToolCall:
    return ToolCall(index=index, id=id, name=name, arguments=arguments)


SCORED = Logprobs(chosen=(TokenLogprob(token="Hi", bytes=(72, 105), logprob=-0.1),), top=((),))


def run(protocol: StreamProtocol, batches: Sequence[Sequence[CompletionEvent]], end: Summary) -> bytes:
    out = protocol.start()
    for batch in batches:
        out += protocol.add_events(batch)
    return out + protocol.finish(end)


def test_start_is_message_start_then_ping() -> None:
    """The stream opens with an empty assistant message that carries the prompt's token count."""
    message: dict[str, Any] = {
        "id": ID,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert parse(stream(12).start()) == [
        ("message_start", {"type": "message_start", "message": message}),
        ("ping", {"type": "ping"}),
    ]


def test_message_start_waits_for_the_cache_share_and_reports_it_as_message_delta_does() -> None:
    """Before admission the cache's share is unknown: SSE comments keep the stream alive; message_start then
    carries the uncached count and the cache read, as message_delta and the whole body do."""
    admitted: list[int] = []
    protocol = MessagesStream(
        id=ID, model=MODEL, input_tokens=25, cached_tokens=lambda: admitted[0] if admitted else None
    )
    assert protocol.start() + protocol.keepalive() == b": keepalive\n\n" * 2
    admitted.append(24)
    end = summary(prompt=25, cached=24)
    events = parse(protocol.keepalive() + protocol.add_events([TextDelta(text="Hi")]) + protocol.finish(end))
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names.count("message_start") == 1
    start_usage = events[0][1]["message"]["usage"]
    delta_usage = next(data for name, data in events if name == "message_delta")["usage"]
    assert start_usage == {**delta_usage, "output_tokens": 0}
    assert start_usage["input_tokens"] == 1 and start_usage["cache_read_input_tokens"] == 24


def test_ping_frame_is_byte_exact() -> None:
    """Framing is `event:` then compact JSON `data:`, then a blank line."""
    assert stream().start().endswith(b'event: ping\ndata: {"type":"ping"}\n\n')


STREAMS = [
    pytest.param([], summary(), ending("end_turn"), id="no-content"),
    pytest.param(
        [[TextDelta(text="Hel")], [TextDelta(text="lo"), TextDelta(text="!")]],
        summary(),
        [*text_block(0, "Hel", "lo", "!"), *ending("end_turn")],
        id="one-text-run-across-batches",
    ),
    pytest.param(
        [[ReasoningDelta(text="Think"), ReasoningDelta(text="ing.")], [TextDelta(text="Answer.")]],
        summary(),
        [*thinking_block(0, "Think", "ing."), *text_block(1, "Answer."), *ending("end_turn")],
        id="thinking-then-text-signature-before-stop",
    ),
    pytest.param(
        [[ReasoningDelta(text="Hmm")]],
        summary(FinishReason.LENGTH),
        [*thinking_block(0, "Hmm"), *ending("max_tokens")],
        id="open-thinking-closed-at-finish",
    ),
    pytest.param(
        [[TextDelta(text="Checking."), call()]],
        summary(FinishReason.TOOL_CALLS),
        [
            *text_block(0, "Checking."),
            *tool_block(1, "toolu_abc", "get_weather", '{"city": "Paris"}'),
            *ending("tool_use"),
        ],
        id="text-then-tool_use",
    ),
    pytest.param(
        [[call(0, "call_a", "now", "{}"), call(1, "call_b")]],
        summary(FinishReason.TOOL_CALLS),
        [
            *tool_block(0, "toolu_a", "now", "{}"),
            *tool_block(1, "toolu_b", "get_weather", '{"city": "Paris"}'),
            *ending("tool_use"),
        ],
        id="two-tool_uses-back-to-back",
    ),
    pytest.param(
        [[call(id="xyz")], [TextDelta(text="Done.")]],
        summary(),
        [*tool_block(0, "toolu_xyz", "get_weather", '{"city": "Paris"}'), *text_block(1, "Done."), *ending("end_turn")],
        id="text-after-tool_use-opens-a-new-block-id-without-call-prefix",
    ),
    pytest.param(
        [[TextDelta(text="a"), ReasoningDelta(text="b"), TextDelta(text="c")]],
        summary(),
        [*text_block(0, "a"), *thinking_block(1, "b"), *text_block(2, "c"), *ending("end_turn")],
        id="every-kind-switch-closes-and-increments",
    ),
    pytest.param(
        [[TextDelta(text=""), SCORED, ReasoningDelta(text="")], [TextDelta(text="Hi"), SCORED, TextDelta(text="")]],
        summary(),
        [*text_block(0, "Hi"), *ending("end_turn")],
        id="empty-deltas-and-logprobs-ignored",
    ),
    pytest.param(
        [[TextDelta(text="x")]],
        summary(FinishReason.LENGTH),
        [*text_block(0, "x"), *ending("max_tokens")],
        id="max_tokens",
    ),
    pytest.param(
        [[TextDelta(text="x")]],
        summary(stop="END"),
        [*text_block(0, "x"), *ending("stop_sequence", "END")],
        id="stop_sequence",
    ),
    pytest.param(
        [[TextDelta(text="x")]],
        summary(prompt=100, completion=9, cached=64),
        [*text_block(0, "x"), *ending("end_turn", input_tokens=36, output=9, cached=64)],
        id="cache-reads-apart-from-input_tokens",
    ),
]


@pytest.mark.parametrize(("batches", "end", "expected"), STREAMS)
def test_stream_events(batches: list[list[CompletionEvent]], end: Summary, expected: list[Event]) -> None:
    """After message_start and ping, the events follow Anthropic's grammar exactly."""
    events = parse(run(stream(), batches, end))
    assert [name for name, _ in events[:2]] == ["message_start", "ping"]
    assert events[2:] == expected


def test_a_stream_without_finish_leaves_no_block_unannounced() -> None:
    """Deltas are sent as they arrive; the block's stop waits for the next kind or the finish."""
    protocol = stream()
    protocol.start()
    assert parse(protocol.add_events([TextDelta(text="a")])) == [
        block_start(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="a"),
    ]
    assert parse(protocol.add_events([TextDelta(text="b")])) == [delta(0, type="text_delta", text="b")]
    assert parse(protocol.add_events([])) == []


@pytest.mark.parametrize(
    "error",
    [invalid("bad"), overloaded(1.0), shutting_down(), engine_dead()],
    ids=["invalid", "overloaded", "shutting-down", "engine-dead"],
)
@pytest.mark.parametrize(
    "batches",
    [[], [[TextDelta(text="part")]], [[ReasoningDelta(text="hm")]]],
    ids=["before-content", "mid-text", "mid-thinking"],
)
def test_error_after_partial_stream_is_a_terminal_error_event(
    batches: list[list[CompletionEvent]], error: RequestError
) -> None:
    """A stream that fails after it began still ends with one `error` event in Anthropic's shape."""
    protocol = stream()
    out = protocol.start()
    for batch in batches:
        out += protocol.add_events(batch)
    events = parse(out + protocol.error(error))
    assert events[-1] == ("error", error_body(error))
    assert [name for name, _ in events].count("error") == 1


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
    """Text and thinking deltas come from a per-block template (wire/sse.Splice): each frame is byte for byte
    what encoding the whole event gives, across blocks (the index changes) and kinds."""
    from wire.sse import frame

    s = stream()
    s.start()
    data = b"".join(
        s.add_events([event])
        for event in (
            ReasoningDelta(text=text),
            ReasoningDelta(text=text),
            TextDelta(text=text),
            TextDelta(text=text + "!"),
        )
    )
    blocks = data.split(b"\n\n")[:-1]
    deltas = 0
    for block in blocks:
        name, payload = parse(block + b"\n\n")[0]
        assert frame(payload, event=name) == block + b"\n\n"
        deltas += name == "content_block_delta" and payload["delta"]["type"] in ("text_delta", "thinking_delta")
    assert deltas == 4
    texts = [(p["index"], p["delta"]) for _, p in parse(data) if p["type"] == "content_block_delta"]
    assert texts == [
        (0, {"type": "thinking_delta", "thinking": text}),
        (0, {"type": "thinking_delta", "thinking": text}),
        (0, {"type": "signature_delta", "signature": ""}),
        (1, {"type": "text_delta", "text": text}),
        (1, {"type": "text_delta", "text": text + "!"}),
    ]
