"""wire/openai_requests.py: bad Chat Completions and Completions bodies and the 400 each raises.

Each row names the `param` and the gist of the message; a field that would
change the output but is not implemented is refused by name with code
`unsupported_parameter`, never dropped. The valid bodies are in
test_openai_requests.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import JsonValue
from tests.wire.test_openai_requests import (
    UNSUPPORTED,
    USER_HI,
    WEATHER,
    chat_body,
    text_body,
)
from wire.openai_requests import decode_chat, decode_completion


def bad(body: JsonValue, param: str | None, gist: str, *, code: str | None = None, id: str) -> Any:
    return pytest.param(body, param, gist, code, id=id)


def unsupported(body: JsonValue, param: str, *, id: str) -> Any:
    return bad(body, param, "not supported", code=UNSUPPORTED, id=id)


def message(**fields: JsonValue) -> dict[str, JsonValue]:
    return chat_body(messages=[fields])


BAD_CHAT = [
    bad([USER_HI], None, "request body must be a JSON object", id="json-array-body"),
    bad("hi", None, "request body must be a JSON object", id="json-string-body"),
    bad(None, None, "request body must be a JSON object", id="json-null-body"),
    bad({"model": "m"}, "messages", "'messages' is required", id="messages-missing"),
    bad(chat_body(messages=None), "messages", "'messages' is required", id="messages-null"),
    bad(chat_body(messages="hi"), "messages", "'messages' must be an array", id="messages-string"),
    bad(chat_body(messages=[]), "messages", "at least one message", id="messages-empty"),
    bad(chat_body(messages=[5]), "messages[0]", "'messages[0]' must be a JSON object", id="message-not-object"),
    bad(
        chat_body(messages=[USER_HI, {"content": "x"}]),
        "messages[1].role",
        "'messages[1].role' must be a string",
        id="role-missing",
    ),
    bad(message(role=5, content="x"), "messages[0].role", "must be a string", id="role-not-string"),
    bad(message(role="narrator", content="x"), "messages[0].role", "must be one of", id="role-unknown"),
    bad(message(role="function", content="x"), "messages[0].role", "'function'", id="role-function"),
    bad(message(role="user"), "messages[0].content", "is required", id="user-content-missing"),
    bad(message(role="user", content=None), "messages[0].content", "is required", id="user-content-null"),
    bad(message(role="system", content=None), "messages[0].content", "is required", id="system-content-null"),
    bad(message(role="user", content=5), "messages[0].content", "'messages[0].content'", id="content-number"),
    bad(
        message(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}]),
        "messages[0].content[0]",
        "must be a data: URL or an http(s) URL",
        id="content-image-part-bad-url",
    ),
    bad(
        message(role="user", content=["hi"]),
        "messages[0].content[0]",
        "must be a JSON object",
        id="content-part-not-object",
    ),
    bad(
        message(role="user", content=[{"type": "text", "text": 5}]),
        "messages[0].content[0].text",
        "must be a string",
        id="content-part-text-not-string",
    ),
    bad(message(role="user", content="x", name=1), "messages[0].name", "must be a string", id="name-not-string"),
    bad(
        message(role="tool", content="x", tool_call_id=1),
        "messages[0].tool_call_id",
        "must be a string",
        id="tool_call_id-not-string",
    ),
    bad(
        message(role="assistant", content=None, tool_calls="f"),
        "messages[0].tool_calls",
        "must be an array",
        id="tool_calls-not-array",
    ),
    bad(
        message(role="assistant", content=None, tool_calls=[{"id": "c", "type": "function"}]),
        "messages[0].tool_calls[0].function",
        "must be a JSON object",
        id="tool_call-without-function",
    ),
    bad(
        message(role="assistant", content=None, tool_calls=[{"function": {"arguments": "{}"}}]),
        "messages[0].tool_calls[0].function.name",
        "must be a string",
        id="tool_call-without-name",
    ),
    bad(
        message(role="assistant", content="x", reasoning_content=5),
        "messages[0].reasoning_content",
        "must be a string",
        id="reasoning_content-not-string",
    ),
    bad(chat_body(max_tokens=-1), "max_tokens", "'max_tokens' must be >= 1, got -1", id="max_tokens-negative"),
    bad(chat_body(max_tokens=0), "max_tokens", "'max_tokens' must be >= 1, got 0", id="max_tokens-zero"),
    bad(chat_body(max_tokens=1.5), "max_tokens", "'max_tokens' must be an integer", id="max_tokens-fraction"),
    bad(chat_body(max_tokens=True), "max_tokens", "'max_tokens' must be an integer", id="max_tokens-bool"),
    bad(chat_body(max_tokens="10"), "max_tokens", "'max_tokens' must be an integer", id="max_tokens-string"),
    bad(chat_body(max_completion_tokens=0), "max_completion_tokens", "must be >= 1", id="max_completion_tokens-zero"),
    bad(
        chat_body(max_completion_tokens=False),
        "max_completion_tokens",
        "must be an integer",
        id="max_completion_tokens-bool",
    ),
    bad(
        chat_body(max_completion_tokens=5, max_tokens=-1),
        "max_tokens",
        "must be >= 1",
        id="max_tokens-checked-even-when-max_completion_tokens-given",
    ),
    bad(chat_body(temperature=-0.1), "temperature", "must be >= 0", id="temperature-negative"),
    bad(chat_body(temperature=2.5), "temperature", "must be <= 2", id="temperature-too-high"),
    bad(chat_body(temperature="hot"), "temperature", "must be a number", id="temperature-string"),
    bad(chat_body(temperature=float("nan")), "temperature", "'temperature'", id="temperature-nan"),
    bad(chat_body(top_p=1.5), "top_p", "must be <= 1", id="top_p-too-high"),
    bad(chat_body(top_p=float("nan")), "top_p", "'top_p'", id="top_p-nan"),
    bad(chat_body(min_p=-1), "min_p", "must be >= 0", id="min_p-negative"),
    bad(chat_body(top_k=-2), "top_k", "must be >= -1", id="top_k-below-minus-one"),
    bad(chat_body(top_k=2.5), "top_k", "must be an integer", id="top_k-fraction"),
    bad(chat_body(seed=1.5), "seed", "must be an integer", id="seed-fraction"),
    bad(chat_body(presence_penalty=3), "presence_penalty", "must be <= 2", id="presence_penalty"),
    bad(chat_body(frequency_penalty=-3), "frequency_penalty", "must be >= -2", id="frequency_penalty"),
    bad(chat_body(repetition_penalty=0), "repetition_penalty", "must be >= 0.01", id="repetition_penalty"),
    bad(chat_body(logit_bias=[]), "logit_bias", "must be a JSON object", id="logit_bias-array"),
    bad(chat_body(logit_bias={"abc": 1}), "logit_bias", "keys must be token ids", id="logit_bias-key-word"),
    bad(chat_body(logit_bias={"-1": 1}), "logit_bias", "keys must be token ids", id="logit_bias-key-negative"),
    bad(chat_body(logit_bias={"5": 101}), "logit_bias", "[-100, 100]", id="logit_bias-value-range"),
    bad(chat_body(logit_bias={"5": True}), "logit_bias", "[-100, 100]", id="logit_bias-value-bool"),
    bad(chat_body(logit_bias={"5": "1"}), "logit_bias", "[-100, 100]", id="logit_bias-value-string"),
    bad(chat_body(stop=""), "stop", "non-empty string", id="stop-empty-string"),
    bad(chat_body(stop=["ok", ""]), "stop", "non-empty string", id="stop-list-with-empty"),
    bad(chat_body(stop=[1]), "stop", "non-empty string", id="stop-list-with-number"),
    bad(chat_body(stop=5), "stop", "'stop' must be an array", id="stop-number"),
    bad(chat_body(stop=[f"s{i}" for i in range(17)]), "stop", "at most 16", id="stop-too-many"),
    bad(chat_body(stream="yes"), "stream", "'stream' must be a boolean", id="stream-string"),
    bad(
        chat_body(stream_options={"include_usage": True}),
        "stream_options",
        "only allowed when 'stream' is true",
        id="stream_options-without-stream",
    ),
    bad(
        chat_body(stream=False, stream_options={"include_usage": True}),
        "stream_options",
        "only allowed when 'stream' is true",
        id="stream_options-with-stream-false",
    ),
    bad(
        chat_body(stream=True, stream_options="usage"),
        "stream_options",
        "must be a JSON object",
        id="stream_options-string",
    ),
    bad(
        chat_body(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
        "must be a boolean",
        id="include_usage-string",
    ),
    bad(chat_body(chat_template_kwargs="x"), "chat_template_kwargs", "must be a JSON object", id="template-kwargs"),
    bad(chat_body(n=0), "n", "'n' must be >= 1", id="n-zero"),
    unsupported(chat_body(n=2), "n", id="n-two"),
    bad(chat_body(top_logprobs=2), "top_logprobs", "needs 'logprobs' to be true", id="top_logprobs-without-logprobs"),
    bad(chat_body(logprobs=True, top_logprobs=21), "top_logprobs", "must be <= 20", id="top_logprobs-too-many"),
    bad(chat_body(logprobs=1), "logprobs", "must be a boolean", id="chat-logprobs-integer"),
    bad(chat_body(tools="f"), "tools", "'tools' must be an array", id="tools-not-array"),
    bad(chat_body(tools=[5]), "tools[0]", "must be a JSON object", id="tool-not-object"),
    unsupported(chat_body(tools=[{"type": "code_interpreter"}]), "tools[0].type", id="tool-type-not-function"),
    bad(chat_body(tools=[{"type": "function"}]), "tools[0].function", "must be a JSON object", id="tool-no-function"),
    bad(
        chat_body(tools=[{"type": "function", "function": {"name": ""}}]),
        "tools[0].function.name",
        "must not be empty",
        id="tool-empty-name",
    ),
    bad(
        chat_body(tools=[{"type": "function", "function": {"parameters": {}}}]),
        "tools[0].function.name",
        "must be a string",
        id="tool-no-name",
    ),
    bad(
        chat_body(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        "tools[0].function.parameters",
        "must be a JSON object",
        id="tool-parameters-not-object",
    ),
    bad(
        chat_body(tool_choice="required"), "tool_choice", "'tool_choice' needs 'tools'", id="tool_choice-without-tools"
    ),
    bad(
        chat_body(tools=[WEATHER], tool_choice="sometimes"),
        "tool_choice",
        "must be 'none', 'auto'",
        id="tool_choice-unknown",
    ),
    bad(
        chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "f"}}),
        "tool_choice.function.name",
        "'f' is not among the tools",
        id="tool_choice-named-unknown-tool",
    ),
    bad(
        chat_body(tools=[WEATHER], tool_choice={"type": "function"}),
        "tool_choice.function",
        "must be a JSON object",
        id="tool_choice-named-without-function",
    ),
    unsupported(chat_body(functions=[{"name": "f"}]), "functions", id="functions"),
    unsupported(chat_body(function_call="auto"), "function_call", id="function_call"),
    bad(chat_body(reasoning_effort="extreme"), "reasoning_effort", "must be one of", id="reasoning_effort-unknown"),
    bad(chat_body(reasoning_effort=5), "reasoning_effort", "must be a string", id="reasoning_effort-not-string"),
    unsupported(chat_body(prediction={"type": "content", "content": "x"}), "prediction", id="prediction"),
    unsupported(chat_body(audio={"voice": "alloy"}), "audio", id="audio"),
    unsupported(chat_body(web_search_options={}), "web_search_options", id="web_search_options"),
    *[
        unsupported(chat_body(**{key: value}), key, id=f"extension-{key}")
        for key, value in [
            ("chat_template", "{{ messages }}"),
            ("prompt_logprobs", 1),
            ("draft_model", "small"),
            ("add_generation_prompt", False),
        ]
    ],
    bad(
        chat_body(continue_final_message=True),
        "continue_final_message",
        "needs the last message to be the assistant's",
        id="continue_final_message-after-a-user-message",
    ),
    bad(chat_body(response_format="json"), "response_format", "must be a JSON object", id="response_format-string"),
    bad(chat_body(response_format={"type": "xml"}), "response_format.type", "'xml'", id="response_format-unknown-type"),
    bad(
        chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        "response_format.json_schema.schema",
        "Missing required parameter",
        id="response_format-json_schema-without-schema",
    ),
    bad(
        chat_body(response_format={"type": "json_object"}, guided_regex="a+"),
        "guided_regex",
        "Only one structured-output constraint",
        id="two-constraints",
    ),
    bad(chat_body(guided_json="{not json"), "guided_json", "is not valid JSON", id="guided_json-bad-text"),
    bad(chat_body(guided_choice=[]), "guided_choice", "non-empty array of strings", id="guided_choice-empty"),
    bad(chat_body(guided_regex=5), "guided_regex", "must be a string", id="guided_regex-not-string"),
    bad(chat_body(structured_outputs={}), "structured_outputs", "exactly one of", id="structured_outputs-empty"),
    unsupported(chat_body(modalities=["text", "audio"]), "modalities", id="modalities-audio"),
    bad(chat_body(modalities="text"), "modalities", "must be an array", id="modalities-string"),
]


@pytest.mark.parametrize(("body", "param", "gist", "code"), BAD_CHAT)
def test_decode_chat_refuses(body: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """A bad chat body is a 400 naming the field; unimplemented fields are refused by name."""
    with pytest.raises(RequestError) as caught:
        decode_chat(body)
    error = caught.value
    assert (error.kind, error.status) == (ErrorKind.INVALID_REQUEST, 400)
    assert error.param == param
    assert gist in error.message
    assert error.code == code


BAD_COMPLETION = [
    bad(["Once"], None, "request body must be a JSON object", id="json-array-body"),
    bad({"model": "m"}, "prompt", "must be a string or a non-empty array", id="prompt-missing"),
    bad(text_body(prompt=5), "prompt", "must be a string or a non-empty array", id="prompt-number"),
    bad(text_body(prompt=[]), "prompt", "must be a string or a non-empty array", id="prompt-empty-list"),
    bad(text_body(prompt=[[]]), "prompt", "must be a string or a non-empty array", id="prompt-empty-ids"),
    bad(text_body(prompt=[True]), "prompt", "must be a string or a non-empty array", id="prompt-bool-id"),
    bad(text_body(prompt=[1.5]), "prompt", "must be a string or a non-empty array", id="prompt-float-id"),
    unsupported(text_body(prompt=["a", "b"]), "prompt", id="prompt-batch-of-strings"),
    unsupported(text_body(prompt=[[1], [2]]), "prompt", id="prompt-batch-of-ids"),
    unsupported(text_body(echo=True), "echo", id="echo"),
    bad(text_body(echo="yes"), "echo", "must be a boolean", id="echo-string"),
    unsupported(text_body(best_of=2), "best_of", id="best_of"),
    bad(text_body(best_of=0), "best_of", "must be >= 1", id="best_of-zero"),
    unsupported(text_body(n=3), "n", id="n"),
    bad(text_body(logprobs=21), "logprobs", "must be <= 20", id="logprobs-too-many"),
    bad(text_body(logprobs=-1), "logprobs", "must be >= 0", id="logprobs-negative"),
    bad(text_body(guided_choice=["a", 1]), "guided_choice", "non-empty array of strings", id="guided_choice-mixed"),
    bad(text_body(max_tokens=0), "max_tokens", "must be >= 1", id="max_tokens-zero"),
    bad(text_body(max_tokens=-5), "max_tokens", "must be >= 1", id="max_tokens-negative"),
    bad(text_body(max_tokens=2.5), "max_tokens", "must be an integer", id="max_tokens-fraction"),
    bad(text_body(max_tokens=False), "max_tokens", "must be an integer", id="max_tokens-bool"),
    bad(text_body(stream_options={"include_usage": True}), "stream_options", "only allowed", id="stream_options"),
    bad(text_body(stop=[""]), "stop", "non-empty string", id="stop-empty"),
]


@pytest.mark.parametrize(("body", "param", "gist", "code"), BAD_COMPLETION)
def test_decode_completion_refuses(body: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """A bad completions body is a 400 naming the field; unimplemented fields are refused by name."""
    with pytest.raises(RequestError) as caught:
        decode_completion(body)
    error = caught.value
    assert (error.kind, error.status) == (ErrorKind.INVALID_REQUEST, 400)
    assert error.param == param
    assert gist in error.message
    assert error.code == code


@pytest.mark.parametrize("decode", [decode_chat, decode_completion], ids=["chat", "completion"])
def test_decoding_leaves_the_body_unchanged(decode: Any) -> None:
    """Decoders are pure: the client's JSON is not mutated."""
    body = {
        "model": "m",
        "messages": [USER_HI],
        "prompt": [1, 2],
        "stop": ["x"],
        "logit_bias": {"3": 1},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    snapshot = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt": [1, 2],
        "stop": ["x"],
        "logit_bias": {"3": 1},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    decode(body)
    assert body == snapshot
