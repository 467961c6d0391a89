"""wire/anthropic_requests.py: bad Messages and count_tokens bodies and the 400 each raises.

The valid bodies are in test_anthropic_requests.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import JsonValue
from tests.wire.test_anthropic_requests import (
    SCHEMA,
    TOOL_USE,
    UNSUPPORTED,
    USER_HI,
    WEATHER,
    assistant,
    body,
    text,
    tool_result,
    user,
)
from wire.anthropic_requests import decode_count_tokens, decode_messages


def bad(value: JsonValue, param: str | None, gist: str, *, code: str | None = None, id: str) -> Any:
    return pytest.param(value, param, gist, code, id=id)


def refused(value: JsonValue, param: str, *, id: str) -> Any:
    return bad(value, param, "not supported", code=UNSUPPORTED, id=id)


def messages(*items: JsonValue) -> dict[str, JsonValue]:
    return body(messages=list(items))


BAD_MESSAGES = [
    bad([USER_HI], None, "must be a JSON object", id="body-array"),
    bad(None, None, "must be a JSON object", id="body-null"),
    bad({"max_tokens": 5, "messages": [USER_HI]}, "model", "'model' must be a string", id="model-missing"),
    bad(body(model=7), "model", "'model' must be a string", id="model-not-string"),
    bad({"model": "m", "messages": [USER_HI]}, "max_tokens", "Field required", id="max_tokens-missing"),
    bad(body(max_tokens=None), "max_tokens", "Field required", id="max_tokens-null"),
    bad(body(max_tokens=0), "max_tokens", ">= 1", id="max_tokens-zero"),
    bad(body(max_tokens=-3), "max_tokens", ">= 1", id="max_tokens-negative"),
    bad(body(max_tokens=2.5), "max_tokens", "integer", id="max_tokens-fraction"),
    bad(body(max_tokens="64"), "max_tokens", "integer", id="max_tokens-string"),
    bad(body(max_tokens=True), "max_tokens", "integer", id="max_tokens-bool"),
    bad({"model": "m", "max_tokens": 5}, "messages", "Field required", id="messages-missing"),
    bad(body(messages=[]), "messages", "at least one message", id="messages-empty"),
    bad(body(messages="hi"), "messages", "must be an array", id="messages-string"),
    bad(
        body(messages=[{"role": "user", "content": []}]), "messages", "every message is empty", id="every-message-empty"
    ),
    bad(messages(5), "messages.0", "must be a JSON object", id="message-not-object"),
    bad(messages({"role": "system", "content": "x"}), "messages", "every message is empty", id="only-system"),
    bad(
        messages({"role": "tool", "content": "x"}), "messages.0.role", "'user', 'assistant' or 'system'", id="role-tool"
    ),
    bad(messages({"role": "system", "content": 5}), "messages.0.content", "must be an array", id="system-entry-number"),
    bad(messages({"content": "x"}), "messages.0.role", "must be a string", id="role-missing"),
    bad(messages({"role": "user"}), "messages.0.content", "must be an array", id="content-missing"),
    bad(messages({"role": "user", "content": 5}), "messages.0.content", "must be an array", id="content-number"),
    bad(messages(user("hi")), "messages.0.content.0", "must be a JSON object", id="block-not-object"),
    bad(
        messages(
            user(text("look"), {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}})
        ),
        "messages.0.content.1",
        "holds no image data",
        code="invalid_image",
        id="image-block-empty",
    ),
    bad(
        messages(user({"type": "document", "source": {"type": "text", "data": "x"}})),
        "messages.0.content.0",
        "'document' content is not supported",
        id="document-block",
    ),
    bad(
        messages(user({"type": "video"})),
        "messages.0.content.0.type",
        "unsupported content block type 'video'",
        id="unknown-block",
    ),
    bad(
        messages(user({"text": "x"})),
        "messages.0.content.0.type",
        "unsupported content block type None",
        id="block-type-missing",
    ),
    bad(messages(user({"type": "text"})), "messages.0.content.0.text", "must be a string", id="text-missing"),
    bad(
        messages(
            USER_HI, assistant({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}})
        ),
        "messages.1.content.0.type",
        "unsupported content block type 'server_tool_use'",
        id="assistant-server_tool_use",
    ),
    bad(
        messages(USER_HI, assistant(tool_result("toolu_1", "x"))),
        "messages.1.content.0.type",
        "'tool_result'",
        id="tool_result-from-assistant",
    ),
    bad(messages(user(TOOL_USE)), "messages.0.content.0.type", "'tool_use'", id="tool_use-from-user"),
    bad(
        messages(USER_HI, assistant({"type": "tool_use", "id": "toolu_1", "name": "f", "input": "{}"})),
        "messages.1.content.0.input",
        "must be a JSON object",
        id="tool_use-input-string",
    ),
    bad(
        messages(USER_HI, assistant({"type": "tool_use", "name": "f", "input": {}})),
        "messages.1.content.0.id",
        "must be a string",
        id="tool_use-id-missing",
    ),
    bad(
        messages(USER_HI, assistant({"type": "tool_use", "id": "toolu_1", "input": {}})),
        "messages.1.content.0.name",
        "must be a string",
        id="tool_use-name-missing",
    ),
    bad(
        messages(USER_HI, assistant({"type": "thinking", "signature": "s"})),
        "messages.1.content.0.thinking",
        "must be a string",
        id="thinking-text-missing",
    ),
    bad(
        messages(user({"type": "tool_result", "content": "x"})),
        "messages.0.content.0.tool_use_id",
        "must be a string",
        id="tool_result-id-missing",
    ),
    bad(
        messages(user(tool_result("toolu_1", [{"type": "image", "source": {}}]))),
        "messages.0.content.0.content.0",
        "'image' content is not supported",
        id="tool_result-image",
    ),
    bad(
        messages(user(tool_result("toolu_1", 5))),
        "messages.0.content.0.content",
        "must be an array",
        id="tool_result-content-number",
    ),
    bad(body(system=5), "system", "must be an array", id="system-number"),
    bad(body(system=[{"type": "image"}]), "system.0", "'image' content is not supported", id="system-image"),
    bad(body(system=["x"]), "system.0", "must be a JSON object", id="system-block-not-object"),
    bad(body(temperature=1.5), "temperature", "<= 1", id="temperature-above-1"),
    bad(body(temperature=-0.1), "temperature", ">= 0", id="temperature-negative"),
    bad(body(temperature="hot"), "temperature", "number", id="temperature-string"),
    bad(body(top_p=1.1), "top_p", "<= 1", id="top_p-above-1"),
    bad(body(top_k=-1), "top_k", ">= 0", id="top_k-negative"),
    bad(body(top_k=0.5), "top_k", "integer", id="top_k-fraction"),
    bad(body(stop_sequences="END"), "stop_sequences", "must be an array", id="stop_sequences-string"),
    bad(body(stop_sequences=["a", ""]), "stop_sequences", "non-empty string", id="stop_sequences-empty-string"),
    bad(body(stop_sequences=["a", 1]), "stop_sequences", "non-empty string", id="stop_sequences-number"),
    bad(body(stop_sequences=[str(i) for i in range(17)]), "stop_sequences", "at most 16", id="stop_sequences-too-many"),
    refused(
        body(tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]),
        "tools.1.type",
        id="server-tool-web_search",
    ),
    refused(body(tools=[{"type": "bash_20250124", "name": "bash"}]), "tools.0.type", id="client-tool-bash"),
    bad(body(tools=WEATHER), "tools", "must be an array", id="tools-object"),
    bad(body(tools=[{"input_schema": SCHEMA}]), "tools.0.name", "must be a string", id="tool-name-missing"),
    bad(body(tools=[{"name": ""}]), "tools.0.name", "must not be empty", id="tool-name-empty"),
    bad(
        body(tools=[{"name": "f", "input_schema": "{}"}]),
        "tools.0.input_schema",
        "must be a JSON object",
        id="tool-schema-string",
    ),
    bad(
        body(tools=[{"name": "f", "description": 5}]),
        "tools.0.description",
        "must be a string",
        id="tool-description-number",
    ),
    bad(body(tool_choice={"type": "any"}), "tool_choice", "no tools", id="tool_choice-any-without-tools"),
    bad(
        body(tool_choice={"type": "tool", "name": "f"}), "tool_choice", "no tools", id="tool_choice-tool-without-tools"
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_time"}),
        "tool_choice.name",
        "'get_time' is not among the tools",
        id="tool_choice-tool-unknown-name",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "tool"}),
        "tool_choice.name",
        "must be a string",
        id="tool_choice-tool-no-name",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "required"}),
        "tool_choice.type",
        "must be 'auto'",
        id="tool_choice-type-openai-spelling",
    ),
    bad(body(tools=[WEATHER], tool_choice="auto"), "tool_choice", "must be a JSON object", id="tool_choice-string"),
    bad(body(thinking={"type": "on"}), "thinking.type", "'enabled', 'disabled' or 'adaptive'", id="thinking-type-bad"),
    bad(body(thinking=True), "thinking", "must be a JSON object", id="thinking-bool"),
    bad(
        body(output_config={"effort": "extreme"}),
        "output_config.effort",
        "must be one of",
        id="output_config-effort-unknown",
    ),
    bad(
        body(output_config={"format": {"type": "json_object"}}),
        "output_config.format.type",
        "only 'json_schema'",
        id="output_config-format-json_object",
    ),
    bad(
        body(output_config={"format": {"type": "json_schema"}}),
        "output_config.format.schema",
        "Missing required parameter",
        id="output_config-format-no-schema",
    ),
    bad(body(stream="yes"), "stream", "must be a boolean", id="stream-string"),
    refused(body(container="cntr_1"), "container", id="container"),
    bad(
        body(mcp_servers=[{"type": "url", "url": "https://x", "name": "x"}]),
        "mcp_servers",
        "anthropic-beta: mcp-client-2025-04-04",
        id="mcp_servers-without-the-beta",
    ),
    refused(
        body(context_management={"edits": [{"type": "compact_20260112"}]}),
        "context_management.edits.0.type",
        id="context_management-compaction",
    ),
    bad(
        body(context_management={"edits": [{"type": "clear_everything"}]}),
        "context_management.edits.0.type",
        "unknown context management edit",
        id="context_management-unknown-edit",
    ),
    bad(
        body(
            context_management={
                "edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "input_tokens", "value": 3}}]
            }
        ),
        "context_management.edits.0.keep.type",
        "must be 'tool_uses'",
        id="context_management-keep-wrong-unit",
    ),
    bad(
        body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024, "display": "full"}),
        "thinking.display",
        "'summarized' or 'omitted'",
        id="thinking-display-unknown",
    ),
    # Anthropic's floor, and its rule that the answer needs room after the thinking.
    bad(
        body(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1023}),
        "thinking.budget_tokens",
        "greater than or equal to 1024",
        id="thinking-budget-below-1024",
    ),
    bad(
        body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 2048}),
        "max_tokens",
        "`max_tokens` must be greater than `thinking.budget_tokens`",
        id="thinking-budget-equal-to-max_tokens",
    ),
    bad(
        body(max_tokens=64, thinking={"type": "enabled", "budget_tokens": 1024}),
        "max_tokens",
        "`max_tokens` must be greater than `thinking.budget_tokens`",
        id="thinking-budget-above-max_tokens",
    ),
]


@pytest.mark.parametrize(("value", "param", "gist", "code"), BAD_MESSAGES)
def test_decode_messages_rejects(value: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """A bad Messages body is a 400 that names the offending field, never a partial request."""
    with pytest.raises(RequestError) as caught:
        decode_messages(value)
    error = caught.value
    assert (error.kind, error.status, error.param, error.code) == (ErrorKind.INVALID_REQUEST, 400, param, code)
    assert gist in error.message


BAD_COUNT_TOKENS = [
    bad({"messages": [USER_HI]}, "model", "must be a string", id="model-missing"),
    bad({"model": "m"}, "messages", "Field required", id="messages-missing"),
    bad(
        {"model": "m", "messages": [{"role": "system", "content": "x"}]},
        "messages",
        "every message is empty",
        id="only-system",
    ),
    refused(
        {"model": "m", "messages": [USER_HI], "tools": [{"type": "web_search_20250305", "name": "w"}]},
        "tools.0.type",
        id="server-tool",
    ),
]


def test_interleaved_thinking_lets_the_budget_pass_max_tokens() -> None:
    """Anthropic's exception: with the interleaved-thinking beta the budget spans the turn's thinking blocks."""
    value = body(max_tokens=64, thinking={"type": "enabled", "budget_tokens": 31999})
    assert decode_messages(value, interleaved_thinking=True).params.thinking_budget == 31999


@pytest.mark.parametrize(("value", "param", "gist", "code"), BAD_COUNT_TOKENS)
def test_decode_count_tokens_rejects(value: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """count_tokens validates the same fields as Messages, except `max_tokens`."""
    with pytest.raises(RequestError) as caught:
        decode_count_tokens(value)
    assert (caught.value.param, caught.value.code) == (param, code)
    assert gist in caught.value.message
