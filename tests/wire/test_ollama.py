"""Ollama's API in `wire/`: request tables (decoding, refusals by name) and the stream protocol's lines."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from pipeline.errors import ErrorKind, RequestError, overloaded
from pipeline.events import (
    CompletionEvent,
    FinishReason,
    ReasoningDelta,
    Summary,
    TextDelta,
    ToolCall,
    ToolCallStart,
    Usage,
)
from pipeline.requests import ChatRequest, ConstraintKind, JsonValue, Role, TextRequest
from wire.ollama import OllamaStream, created_at, error_body, error_status, load_reply
from wire.ollama_models import decode_ollama_embed
from wire.ollama_requests import decode_ollama_chat, decode_ollama_generate, defaults_view, read_keep_alive

PNG = "iVBORw0KGgo="  # base64 of a PNG signature: the envelope is checked here, the picture on the prompt side
USER: list[JsonValue] = [{"role": "user", "content": "hi"}]


def _chat(**body: JsonValue) -> ChatRequest:
    return decode_ollama_chat({"model": "m", "messages": USER, **body})


def test_options_map_onto_sampling() -> None:
    options: dict[str, JsonValue] = {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.1,
        "seed": 7,
        "num_predict": 12,
    }
    options |= {"stop": ["\n"], "repeat_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.25}
    params = _chat(options={**options, "num_gpu": 99, "num_thread": 4}).params
    sampling = params.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p, sampling.seed) == (
        0.3,
        0.8,
        20,
        0.1,
        7,
    )
    assert (sampling.repetition_penalty, sampling.presence_penalty, sampling.frequency_penalty) == (1.2, 0.5, 0.25)
    assert params.max_tokens == 12 and params.stop == ("\n",)


@pytest.mark.parametrize(("predict", "expected"), [(-1, None), (-2, None), (5, 5)])
def test_num_predict_negative_is_no_limit(predict: int, expected: int | None) -> None:
    assert _chat(options={"num_predict": predict}).params.max_tokens == expected


def test_num_ctx_caps_the_generation() -> None:
    assert _chat(options={"num_ctx": 64}).params.max_tokens == 64
    assert _chat(options={"num_ctx": 64, "num_predict": 8}).params.max_tokens == 8


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"options": {"mirostat": 1}}, "options.mirostat"),
        ({"options": {"tfs_z": 0.9}}, "options.tfs_z"),
        ({"options": {"penalize_newline": True}}, "options.penalize_newline"),
        ({"options": {"repeat_last_n": 64}}, "options.repeat_last_n"),
        ({"options": {"no_such_option": 1}}, "options.no_such_option"),
        ({"options": {"top_p": 2}}, "options.top_p"),
        ({"format": "yaml"}, "format"),
        ({"think": "maximal"}, "think"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x", "images": ["%%%"]}]}, "messages[0].images[0]"),
        ({"messages": []}, "messages"),
        ({"keep_alive": "soon"}, "keep_alive"),
        ({"logprobs": True}, "logprobs"),
        ({"temperature": 0.5}, "temperature"),
    ],
)
def test_chat_refusals_name_the_field(body: dict[str, JsonValue], param: str) -> None:
    with pytest.raises(RequestError) as raised:
        decode_ollama_chat(read_keep_alive_too({"model": "m", "messages": USER, **body}))
    assert raised.value.param == param and raised.value.kind is ErrorKind.INVALID_REQUEST


def read_keep_alive_too(body: dict[str, JsonValue]) -> dict[str, JsonValue]:
    read_keep_alive(body)
    return body


def test_neutral_values_of_unsupported_options_pass() -> None:
    assert _chat(options={"mirostat": 0, "tfs_z": 1.0, "penalize_newline": False}).messages[0].content == "hi"


def test_messages_tools_images_and_think() -> None:
    messages: list[JsonValue] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "look", "images": [PNG]},
        {
            "role": "assistant",
            "content": "",
            "thinking": "hmm",
            "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
        },
        {"role": "tool", "content": "42", "tool_name": "f"},
    ]
    tools: list[JsonValue] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = decode_ollama_chat({"model": "m", "messages": messages, "tools": tools, "think": True})
    assert [message.role for message in chat.messages] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL]
    assert chat.messages[1].images[0].data == b"\x89PNG\r\n\x1a\n"
    call = chat.messages[2].tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("f", {"a": 1})
    assert chat.messages[2].reasoning == "hmm" and chat.messages[3].name == "f"
    assert chat.tools[0].name == "f" and chat.template_kwargs == {"enable_thinking": True}
    assert chat.stream is True  # Ollama streams unless told not to


def test_format_json_and_schema() -> None:
    constraint = _chat(format="json").params.constraint
    assert constraint is not None and constraint.kind is ConstraintKind.JSON_SCHEMA
    schema: JsonValue = {"type": "object", "properties": {"a": {"type": "integer"}}}
    given = _chat(format=schema).params.constraint
    assert given is not None and given.spec == schema
    assert _chat(format="").params.constraint is None


def test_generate_renders_a_turn_unless_raw() -> None:
    chat = decode_ollama_generate({"model": "m", "prompt": "p", "system": "s", "images": [PNG], "stream": False})
    assert isinstance(chat, ChatRequest) and [m.role for m in chat.messages] == [Role.SYSTEM, Role.USER]
    assert chat.messages[1].images and chat.stream is False
    raw = decode_ollama_generate({"model": "m", "prompt": "p", "raw": True})
    assert isinstance(raw, TextRequest) and raw.prompt == "p"
    fim = decode_ollama_generate({"model": "m", "prompt": "def f(", "suffix": "  return x"})
    assert isinstance(fim, TextRequest) and fim.suffix == "  return x"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "p", "context": [1, 2]}, "context"),
        ({"prompt": "p", "template": "{{ .Prompt }}"}, "template"),
        ({"prompt": "p", "raw": True, "system": "s"}, "system"),
    ],
)
def test_generate_refusals(body: dict[str, JsonValue], param: str) -> None:
    with pytest.raises(RequestError) as raised:
        decode_ollama_generate({"model": "m", **body})
    assert raised.value.param == param


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        ("0", 0.0),
        (300, 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        (-1, math.inf),
        ("-1m", math.inf),
    ],
)
def test_keep_alive(value: JsonValue, seconds: float) -> None:
    assert read_keep_alive({"keep_alive": value}) == seconds


def test_defaults_view_hoists_only_what_the_client_set() -> None:
    body: dict[str, JsonValue] = {
        "model": "m",
        "options": {"temperature": 0.1, "num_predict": -1, "repeat_penalty": 1.1},
    }
    view = defaults_view(body)
    assert view["temperature"] == 0.1 and view["repetition_penalty"] == 1.1 and "max_tokens" not in view
    # The hoisted copies agree with `options`, so the decoder takes the view as it takes the body.
    assert decode_ollama_chat({**view, "messages": USER}).params.sampling.temperature == 0.1


def test_embed_inputs() -> None:
    assert decode_ollama_embed({"model": "m", "input": "a"}).inputs == ("a",)
    assert decode_ollama_embed({"model": "m", "input": ["a", "b"], "truncate": True}).inputs == ("a", "b")
    assert decode_ollama_embed({"model": "m", "prompt": "legacy"}).inputs == ("legacy",)
    with pytest.raises(RequestError):
        decode_ollama_embed({"model": "m", "input": []})


def _ticks() -> Iterator[int]:
    now = 1_700_000_000_000_000_000
    while True:
        now += 1_000_000
        yield now


def _stream(*, chat: bool) -> OllamaStream:
    ticks = _ticks()
    return OllamaStream(model="m", chat=chat, arrived_ns=1_700_000_000_000_000_000, clock=lambda: next(ticks))


SUMMARY = Summary(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=7, completion_tokens=3))


def test_chat_stream_lines() -> None:
    stream = _stream(chat=True)
    assert stream.start() == b"" and stream.keepalive() == b""
    events: list[CompletionEvent] = [ReasoningDelta(text="so"), TextDelta(text="He"), TextDelta(text="llo")]
    lines = [json.loads(line) for line in stream.add_events(events).splitlines()]
    assert [line["message"] for line in lines] == [
        {"role": "assistant", "content": "", "thinking": "so"},
        {"role": "assistant", "content": "Hello"},
    ]
    call: list[CompletionEvent] = [
        ToolCallStart(index=0, id="call_1", name="f"),
        ToolCall(index=0, id="call_1", name="f", arguments='{"a":1}'),
    ]
    (called,) = [json.loads(line) for line in stream.add_events(call).splitlines()]
    assert called["message"]["tool_calls"] == [
        {"id": "call_1", "function": {"index": 0, "name": "f", "arguments": {"a": 1}}}
    ]
    final = json.loads(stream.finish(SUMMARY))
    assert final["done"] is True and final["done_reason"] == "stop" and final["message"]["content"] == ""
    assert (final["prompt_eval_count"], final["eval_count"]) == (7, 3)
    assert final["total_duration"] > final["eval_duration"] > 0 and final["prompt_eval_duration"] > 0
    assert all(line["done"] is False for line in lines)


def test_generate_body_and_length() -> None:
    summary = Summary(finish_reason=FinishReason.LENGTH, usage=Usage(prompt_tokens=2, completion_tokens=1))
    body = _stream(chat=False).body([TextDelta(text="a"), TextDelta(text="b")], summary)
    assert body["response"] == "ab" and body["done_reason"] == "length" and "message" not in body


def test_errors_and_stamps() -> None:
    assert error_body(RequestError(kind=ErrorKind.NOT_FOUND, message="gone")) == {"error": "gone"}
    assert error_status(overloaded(1.0)) == 503
    assert created_at(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456789Z"
    assert load_reply("m", unloaded=True, clock=lambda: 0)["done_reason"] == "unload"
