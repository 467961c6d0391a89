"""wire/openai.py: completion events → OpenAI SSE frames, and error bodies.

The stream protocols do no I/O, so each test feeds events in and compares
the frames out, parsed from the exact bytes: every frame is one `data:`
line and a blank line, and every stream ends with `data: [DONE]`. The
non-streaming bodies are in test_openai_bodies.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError, engine_dead, invalid, overloaded, shutting_down
from pipeline.events import CompletionEvent, FinishReason, ReasoningDelta, Summary, TextDelta, ToolCall, Usage
from pipeline.protocol import StreamProtocol
from pipeline.requests import JsonValue
from wire.openai import ChatStream, TextStream, error_body

ID, CREATED, MODEL = "req-1", 1_700_000_000, "mlx-relay/tiny"
Payload = JsonValue


def payloads(data: bytes) -> list[Payload]:
    """The data of each SSE frame in `data`, JSON-decoded; `[DONE]` stays a string."""
    if not data:
        return []
    assert data.endswith(b"\n\n"), data
    found: list[Payload] = []
    for block in data.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: ") and b"\n" not in block, block
        text = block.removeprefix(b"data: ").decode()
        found.append(text if text == "[DONE]" else json.loads(text))
    return found


def run_stream(protocol: StreamProtocol, batches: Sequence[Sequence[CompletionEvent]], summary: Summary) -> bytes:
    out = protocol.start()
    for batch in batches:
        out += protocol.add_events(batch)
    return out + protocol.finish(summary)


def summary(reason: FinishReason = FinishReason.STOP, prompt: int = 5, completion: int = 3, cached: int = 0) -> Summary:
    return Summary(
        finish_reason=reason, usage=Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    )


def usage_json(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """OpenAI's usage object: totals, prompt tokens from the prompt cache, completion tokens spent reasoning."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **usage: Any) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return {**chunk, **usage}


def text_chunk(text: str, finish: str | None = None, **usage: Any) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": ID,
        "object": "text_completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    return {**chunk, **usage}


def usage_chunk(obj: str, prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "id": ID,
        "object": obj,
        "created": CREATED,
        "model": MODEL,
        "choices": [],
        "usage": usage_json(prompt, completion, cached),
    }


def deltas(*texts: str) -> list[CompletionEvent]:
    return [TextDelta(text=t) for t in texts]


ROLE = {"role": "assistant", "content": ""}
CALL_0 = ToolCall(index=0, id="call_a", name="get_weather", arguments='{"city": "Paris"}')
CALL_1 = ToolCall(index=1, id="call_b", name="ping", arguments="{}")
STREAMED_CALL_0 = {
    "index": 0,
    "id": "call_a",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
STREAMED_CALL_1 = {"index": 1, "id": "call_b", "type": "function", "function": {"name": "ping", "arguments": "{}"}}


def reasoning(text: str) -> dict[str, Any]:
    return {"reasoning_content": text, "reasoning": text}


NULL = {"usage": None}

STREAMS = [
    pytest.param(
        ChatStream,
        False,
        [deltas("Hel", "lo"), deltas(" world")],
        summary(),
        [
            chat_chunk(ROLE),
            chat_chunk({"content": "Hello"}),
            chat_chunk({"content": " world"}),
            chat_chunk({}, "stop"),
            "[DONE]",
        ],
        id="chat-batches-joined-per-frame",
    ),
    pytest.param(
        ChatStream,
        False,
        [[], deltas(""), deltas("x"), deltas("", "")],
        summary(FinishReason.LENGTH),
        [chat_chunk(ROLE), chat_chunk({"content": "x"}), chat_chunk({}, "length"), "[DONE]"],
        id="chat-empty-batches-send-nothing",
    ),
    pytest.param(
        ChatStream,
        False,
        [],
        summary(),
        [chat_chunk(ROLE), chat_chunk({}, "stop"), "[DONE]"],
        id="chat-no-text",
    ),
    pytest.param(
        ChatStream,
        True,
        [deltas("日本"), deltas("語")],
        summary(FinishReason.LENGTH, prompt=7, completion=2, cached=4),
        [
            chat_chunk(ROLE, **NULL),
            chat_chunk({"content": "日本"}, **NULL),
            chat_chunk({"content": "語"}, **NULL),
            chat_chunk({}, "length", **NULL),
            usage_chunk("chat.completion.chunk", 7, 2, cached=4),
            "[DONE]",
        ],
        id="chat-include_usage",
    ),
    pytest.param(
        ChatStream,
        False,
        [[ReasoningDelta(text="think "), ReasoningDelta(text="hard"), TextDelta(text="Answer")], deltas(".")],
        summary(),
        [
            chat_chunk(ROLE),
            chat_chunk(reasoning("think hard")),
            chat_chunk({"content": "Answer"}),
            chat_chunk({"content": "."}),
            chat_chunk({}, "stop"),
            "[DONE]",
        ],
        id="chat-reasoning-then-answer-one-chunk-per-run",
    ),
    pytest.param(
        ChatStream,
        False,
        [[TextDelta(text="Let me check."), CALL_0, CALL_1]],
        summary(FinishReason.TOOL_CALLS),
        [
            chat_chunk(ROLE),
            chat_chunk({"content": "Let me check."}),
            chat_chunk({"tool_calls": [STREAMED_CALL_0]}),
            chat_chunk({"tool_calls": [STREAMED_CALL_1]}),
            chat_chunk({}, "tool_calls"),
            "[DONE]",
        ],
        id="chat-tool-calls-one-chunk-each",
    ),
    pytest.param(
        TextStream,
        False,
        [[ReasoningDelta(text="hidden"), TextDelta(text="shown")]],
        summary(),
        [text_chunk("shown"), text_chunk("", "stop"), "[DONE]"],
        id="text-carries-only-text",
    ),
    pytest.param(
        TextStream,
        False,
        [deltas("Once", " upon"), deltas(" a time")],
        summary(FinishReason.LENGTH),
        [text_chunk("Once upon"), text_chunk(" a time"), text_chunk("", "length"), "[DONE]"],
        id="text-no-role-chunk",
    ),
    pytest.param(
        TextStream,
        False,
        [[], deltas("")],
        summary(),
        [text_chunk("", "stop"), "[DONE]"],
        id="text-empty",
    ),
    pytest.param(
        TextStream,
        True,
        [deltas("a")],
        summary(prompt=3, completion=1),
        [text_chunk("a", **NULL), text_chunk("", "stop", **NULL), usage_chunk("text_completion", 3, 1), "[DONE]"],
        id="text-include_usage",
    ),
]


@pytest.mark.parametrize(("cls", "include_usage", "batches", "end", "expected"), STREAMS)
def test_stream_frames(
    cls: type[ChatStream | TextStream],
    include_usage: bool,
    batches: list[list[CompletionEvent]],
    end: Summary,
    expected: list[Payload],
) -> None:
    """start/add_events/finish give exactly OpenAI's chunk sequence, usage only when asked, then [DONE]."""
    protocol = cls(id=ID, created=CREATED, model=MODEL, include_usage=include_usage)
    assert payloads(run_stream(protocol, batches, end)) == expected


def test_first_chat_frame_is_byte_exact() -> None:
    """The role chunk is compact JSON on one `data:` line, keys in OpenAI's order."""
    assert ChatStream(id=ID, created=CREATED, model=MODEL).start() == (
        b'data: {"id":"req-1","object":"chat.completion.chunk","created":1700000000,"model":"mlx-relay/tiny",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
        b"\n\n"
    )


@pytest.mark.parametrize("include_usage", [False, True], ids=["plain", "include_usage"])
@pytest.mark.parametrize("cls", [ChatStream, TextStream], ids=["chat", "text"])
def test_error_after_partial_stream_still_ends_the_stream(
    cls: type[ChatStream | TextStream], include_usage: bool
) -> None:
    """A stream that fails after it began ends with an error frame and then [DONE], nothing else."""
    protocol = cls(id=ID, created=CREATED, model=MODEL, include_usage=include_usage)
    begun = payloads(protocol.start() + protocol.add_events(deltas("partial")))
    tail = payloads(protocol.error(engine_dead()))
    assert begun and all(isinstance(p, dict) and "choices" in p for p in begun)
    assert tail == [
        {
            "error": {
                "message": "The inference engine has stopped; see the server log",
                "type": "server_error",
                "param": None,
                "code": "engine_dead",
            }
        },
        "[DONE]",
    ]


@pytest.mark.parametrize(
    ("error", "expected_type"),
    [
        pytest.param(invalid("bad", param="messages", code="c"), "invalid_request_error", id="invalid"),
        pytest.param(RequestError(kind=ErrorKind.NOT_FOUND, message="m"), "not_found_error", id="not-found"),
        pytest.param(
            RequestError(kind=ErrorKind.METHOD_NOT_ALLOWED, message="m"), "invalid_request_error", id="method"
        ),
        pytest.param(overloaded(2.0), "rate_limit_error", id="overloaded"),
        pytest.param(shutting_down(), "server_error", id="unavailable"),
        pytest.param(RequestError(kind=ErrorKind.INTERNAL, message="m"), "server_error", id="internal"),
    ],
)
def test_error_body_shape(error: RequestError, expected_type: str) -> None:
    """Every error kind renders as OpenAI's {"error": {message, type, param, code}}."""
    assert error_body(error) == {
        "error": {"message": error.message, "type": expected_type, "param": error.param, "code": error.code}
    }


def test_every_error_kind_has_an_openai_type() -> None:
    """No ErrorKind can reach error_body without a rendering (it would raise KeyError)."""
    for kind in ErrorKind:
        assert error_body(RequestError(kind=kind, message="m"))["error"]


TRICKY_TEXTS = ["plain", 'quote " and \\ backslash', "line\nbreak\ttab", "日本 ☕ 🙂", "\x00\x1f ctrl", "</script>", ""]


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_a_text_only_chunk_is_the_bytes_the_whole_chunk_encodes_to(text: str, include_usage: bool) -> None:
    """The spliced per-token frame (wire/sse.Splice) equals the frame of the whole chunk, byte for byte."""
    from wire.sse import frame

    for stream, choice in (
        (
            ChatStream(id=ID, created=CREATED, model=MODEL, include_usage=include_usage),
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None},
        ),
        (
            TextStream(id=ID, created=CREATED, model=MODEL, include_usage=include_usage),
            {"index": 0, "text": text, "logprobs": None, "finish_reason": None},
        ),
    ):
        chunk: dict[str, JsonValue] = {"id": ID, "object": stream.object_name, "created": CREATED, "model": MODEL}
        chunk["choices"] = [choice]
        if include_usage:
            chunk["usage"] = None
        expected = frame(chunk) if text else b""
        # Twice: the second frame comes from the template the first one built.
        assert stream.add_events([TextDelta(text=text)]) == expected
        assert stream.add_events([TextDelta(text=text[:1]), TextDelta(text=text[1:])]) == expected
