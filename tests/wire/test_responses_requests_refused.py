"""wire/responses_requests.py: bad Responses bodies and the 400 each raises, before any store lookup.

The valid bodies and the splice into chat requests are in test_responses_requests.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import JsonObject, JsonValue
from tests.wire.test_responses_requests import (
    SCHEMA,
    UNSUPPORTED,
    USER_HI_ITEM,
    WEATHER,
    body,
)
from tests.wire.test_responses_to_chat import function_output, items
from wire.responses_requests import decode_responses


def bad(value: JsonValue, param: str | None, gist: str, *, code: str | None = None, id: str) -> Any:
    return pytest.param(value, param, gist, code, id=id)


def refused(value: JsonValue, param: str, *, id: str) -> Any:
    return bad(value, param, "not supported", code=UNSUPPORTED, id=id)


IMAGE_PART: JsonObject = {"type": "input_image", "image_url": "https://example.com/a.png"}
FILE_IMAGE_PART: JsonObject = {"type": "input_image", "file_id": "file-abc"}

BAD = [
    bad([USER_HI_ITEM], None, "must be a JSON object", id="body-array"),
    bad({"model": "m"}, "input", "Missing required parameter: 'input'", id="input-missing"),
    bad(body(input=None), "input", "Missing required parameter", id="input-null"),
    bad(body(input=[]), "input", "must not be empty", id="input-empty-list"),
    bad(body(input=5), "input", "must be an array", id="input-number"),
    bad(body(truncation="middle"), "truncation", "'auto' or 'disabled'", id="truncation-unknown"),
    bad(items("hi"), "input[0]", "must be a JSON object", id="item-not-object"),
    bad(items({"role": "bot", "content": "x"}), "input[0].role", "'bot'", id="bad-role"),
    bad(items({"role": "tool", "content": "x"}), "input[0].role", "'tool'", id="role-tool"),
    bad(items({"type": "message", "content": "x"}), "input[0].role", "must be a string", id="role-missing"),
    bad(items({"role": "user", "content": 5}), "input[0].content", "must be an array", id="content-number"),
    bad(items({"role": "user"}), "input[0].content", "must be an array", id="content-missing"),
    bad(
        items({"role": "user", "content": [{"type": "input_text", "text": "see"}, FILE_IMAGE_PART]}),
        "input[0].content[1].file_id",
        "uploaded files are not supported",
        code=UNSUPPORTED,
        id="input_image-file_id",
    ),
    bad(
        items({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}),
        "input[0].content[0].type",
        "'input_file' is not supported",
        id="input_file",
    ),
    bad(
        items({"role": "user", "content": ["x"]}), "input[0].content[0]", "must be a JSON object", id="part-not-object"
    ),
    bad(
        items({"role": "user", "content": [{"type": "input_text"}]}),
        "input[0].content[0].text",
        "must be a string",
        id="part-text-missing",
    ),
    bad(
        items({"type": "item_reference", "id": "msg_1"}),
        "input[0].type",
        "'item_reference' items are not supported",
        id="item_reference",
    ),
    bad(
        items(USER_HI_ITEM, {"type": "web_search_call", "id": "ws_1", "status": "completed"}),
        "input[1].type",
        "'web_search_call'",
        id="built-in-tool-call-item",
    ),
    bad(
        items({"type": "function_call", "name": "f", "arguments": "{}"}),
        "input[0].call_id",
        "must be a string",
        id="call-id-missing",
    ),
    bad(
        items({"type": "function_call", "call_id": "c", "arguments": "{}"}),
        "input[0].name",
        "must be a string",
        id="call-name-missing",
    ),
    bad(
        items({"type": "function_call_output", "output": "x"}),
        "input[0].call_id",
        "must be a string",
        id="output-call-id-missing",
    ),
    bad(
        items(function_output("c", [IMAGE_PART])),
        "input[0].output[0]",
        "images are not allowed here",
        id="output-image",
    ),
    bad(items(function_output("c", 5)), "input[0].output", "must be an array", id="output-number"),
    bad(body(previous_response_id="abc"), "previous_response_id", "is not a response id", id="previous-id-no-prefix"),
    bad(
        body(previous_response_id="resp_"),
        "previous_response_id",
        "is not a response id",
        id="previous-id-empty-suffix",
    ),
    bad(body(previous_response_id="resp_a b"), "previous_response_id", "is not a response id", id="previous-id-space"),
    bad(body(previous_response_id=5), "previous_response_id", "must be a string", id="previous-id-number"),
    bad(body(max_output_tokens=0), "max_output_tokens", ">= 1", id="max_output_tokens-zero"),
    bad(body(max_output_tokens="8"), "max_output_tokens", "integer", id="max_output_tokens-string"),
    bad(body(temperature=3), "temperature", "<= 2", id="temperature-3"),
    bad(body(temperature=-1), "temperature", ">= 0", id="temperature-negative"),
    bad(body(top_p=1.5), "top_p", "<= 1", id="top_p-above-1"),
    bad(body(instructions=5), "instructions", "must be a string", id="instructions-number"),
    bad(body(store="yes"), "store", "must be a boolean", id="store-string"),
    bad(body(stream=1), "stream", "must be a boolean", id="stream-number"),
    bad(body(metadata="x"), "metadata", "must be a JSON object", id="metadata-string"),
    bad(body(background=True, store=False), "background", "require 'store'", id="background-without-store"),
    refused(body(conversation="conv_1"), "conversation", id="conversation"),
    refused(body(prompt={"id": "pmpt_1"}), "prompt", id="prompt-template"),
    refused(body(top_logprobs=5), "top_logprobs", id="top_logprobs"),
    bad(body(reasoning={"effort": "extreme"}), "reasoning.effort", "'extreme'", id="effort-invalid"),
    bad(body(reasoning="high"), "reasoning", "must be a JSON object", id="reasoning-string"),
    bad(body(tools={"type": "function"}), "tools", "must be an array", id="tools-object"),
    bad(body(tools=[5]), "tools[0]", "must be a JSON object", id="tool-not-object"),
    bad(
        body(tools=[{"type": "function", "parameters": SCHEMA}]),
        "tools[0].name",
        "must be a string",
        id="tool-name-missing",
    ),
    bad(
        body(tools=[{"type": "function", "name": "f", "parameters": []}]),
        "tools[0].parameters",
        "must be a JSON object",
        id="tool-parameters-array",
    ),
    bad(body(tool_choice="required"), "tool_choice", "no function tools", id="tool_choice-required-without-tools"),
    bad(
        body(tools=[{"type": "web_search"}], tool_choice="required"),
        "tool_choice",
        "no function tools",
        id="tool_choice-required-only-built-in-tools",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "function", "name": "now"}),
        "tool_choice.name",
        "'now' is not among the tools",
        id="tool_choice-unknown-function",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "function"}),
        "tool_choice.name",
        "must be a string",
        id="tool_choice-function-no-name",
    ),
    bad(
        body(tools=[WEATHER], tool_choice="any"),
        "tool_choice",
        "must be 'none', 'auto', 'required'",
        id="tool_choice-anthropic-spelling",
    ),
    bad(
        body(tools=[WEATHER, {"type": "web_search_preview"}], tool_choice={"type": "web_search_preview"}),
        "tool_choice.type",
        "hosted tool 'web_search_preview' cannot run on this server",
        id="tool_choice-forces-a-hosted-tool",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "allowed_tools", "mode": "auto", "tools": []}),
        "tool_choice",
        "must be 'none', 'auto', 'required'",
        id="tool_choice-allowed_tools",
    ),
    refused(body(tools=[{"type": "local_shell"}]), "tools[0].type", id="tool-type-local_shell"),
    refused(body(tools=[{"type": "apply_patch"}]), "tools[0].type", id="tool-type-hosted-apply_patch"),
    refused(
        body(tools=[{"type": "namespace", "name": "n", "tools": [{"type": "mcp", "server_label": "x"}]}]),
        "tools[0].tools[0].type",
        id="namespace-member-of-another-type",
    ),
    bad(
        body(
            tools=[{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]
        ),
        "tools[0].format.syntax",
        "expected 'lark' or 'regex'",
        id="custom-tool-grammar-syntax",
    ),
    bad(
        body(tools=[WEATHER, {"type": "custom", "name": "get_weather"}]),
        "tools[1].name",
        "already defined",
        id="duplicate-tool-name",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "custom", "name": "get_weather"}),
        "tool_choice.type",
        "is a function tool",
        id="tool_choice-custom-names-a-function",
    ),
    bad(body(text={"format": {"type": "xml"}}), "text.format.type", "'xml'", id="text-format-bad-type"),
    bad(
        body(text={"format": {"type": "json_schema", "name": "n"}}),
        "text.format.schema",
        "Missing required parameter",
        id="text-format-no-schema",
    ),
    bad(body(text="json"), "text", "must be a JSON object", id="text-string"),
]


@pytest.mark.parametrize(("value", "param", "gist", "code"), BAD)
def test_decode_responses_rejects(value: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """A bad Responses body is a 400 naming its field, raised before any stored history is read."""
    with pytest.raises(RequestError) as caught:
        decode_responses(value)
    error = caught.value
    assert (error.kind, error.status, error.param, error.code) == (ErrorKind.INVALID_REQUEST, 400, param, code)
    assert gist in error.message
