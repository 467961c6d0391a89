"""wire/anthropic_mcp.py: the MCP connector's servers and toolsets, its blocks, and the history they read back as."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import RequestError
from pipeline.events import ToolCall
from pipeline.requests import JsonObject, JsonValue, Message, Role, Tool, ToolCallRecord, ToolChoice, ToolChoiceMode
from tests.wire.test_anthropic_requests import WEATHER, WEATHER_TOOL, body
from wire.anthropic_mcp import decode_mcp_messages, first_choice, result_block, round_messages, use_block

URL = "https://mcp.example.com/mcp"


def server(name: str = "calc", **fields: JsonValue) -> JsonObject:
    return {"type": "url", "url": URL, "name": name, **fields}


def toolset(name: str = "calc", **fields: JsonValue) -> JsonObject:
    return {"type": "mcp_toolset", "mcp_server_name": name, **fields}


def listed(*names: str) -> list[JsonObject]:
    return [{"name": name} for name in names]


# (body, the tools of a listing of add, echo and flip that the server keeps)
CHOSEN = [
    pytest.param(body(mcp_servers=[server()]), ["add", "echo", "flip"], id="all"),
    pytest.param(
        body(mcp_servers=[server(tool_configuration={"enabled": True, "allowed_tools": ["add"]})]),
        ["add"],
        id="2025-04-04-allowed_tools",
    ),
    pytest.param(body(mcp_servers=[server(tool_configuration={"enabled": False})]), [], id="2025-04-04-disabled"),
    pytest.param(
        body(mcp_servers=[server()], tools=[toolset(configs={"echo": {"enabled": False}})]),
        ["add", "flip"],
        id="2025-11-20-denylist",
    ),
    pytest.param(
        body(
            mcp_servers=[server()],
            tools=[toolset(default_config={"enabled": False}, configs={"flip": {"enabled": True}}), WEATHER],
        ),
        ["flip"],
        id="2025-11-20-allowlist-beside-a-client-tool",
    ),
]


@pytest.mark.parametrize(("value", "kept"), CHOSEN)
def test_the_tools_a_server_offers(value: JsonValue, kept: list[str]) -> None:
    (decoded,) = decode_mcp_messages(value).servers
    assert [tool["name"] for tool in listed("add", "echo", "flip") if decoded.keeps(tool)] == kept
    assert decoded.label == "calc" and decoded.url == URL and not decoded.needs_approval("add")


def test_the_token_is_a_header_never_shown() -> None:
    (decoded,) = decode_mcp_messages(body(mcp_servers=[server(authorization_token="s3cret")])).servers
    assert decoded.headers == {"Authorization": "Bearer s3cret"} and "s3cret" not in repr(decoded)


def test_the_client_tools_stay_the_decoders_and_the_choice_waits_for_the_listing() -> None:
    value = body(mcp_servers=[server()], tools=[toolset(), WEATHER], tool_choice={"type": "tool", "name": "flip"})
    decoded = decode_mcp_messages(value)
    assert decoded.chat.tools == (WEATHER_TOOL,) and decoded.chat.tool_choice == ToolChoice()
    flip = Tool(name="flip", description=None, parameters={})
    assert first_choice(decoded, (WEATHER_TOOL, flip)) == ToolChoice(mode=ToolChoiceMode.NAMED, name="flip")
    with pytest.raises(RequestError, match="not among the tools"):
        first_choice(decoded, (WEATHER_TOOL,))


REFUSED = [
    pytest.param(body(mcp_servers=[{**server(), "type": "stdio"}]), "mcp_servers.0.type", id="not-url"),
    pytest.param(body(mcp_servers=[server(), server()]), "mcp_servers.1.name", id="name-twice"),
    pytest.param(body(mcp_servers=[server()], tools=[toolset("other")]), "tools", id="toolset-of-no-server"),
    pytest.param(body(mcp_servers=[server()], tools=[toolset(), toolset()]), "tools.1.mcp_server_name", id="two-sets"),
    pytest.param(
        body(mcp_servers=[server(tool_configuration={"enabled": True})], tools=[toolset()]),
        "mcp_servers.0.tool_configuration",
        id="configured-twice",
    ),
    pytest.param(
        body(mcp_servers=[server()], tools=[toolset(default_config={"defer_loading": True})]),
        "tools.0.defer_loading",
        id="defer_loading",
    ),
    pytest.param(body(mcp_servers=[server()], tools=[toolset(tools=[])]), "tools.0.tools", id="pinned-listing"),
    pytest.param(
        body(
            mcp_servers=[server()], messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "A"}]
        ),
        "messages",
        id="prefill",
    ),
]


@pytest.mark.parametrize(("value", "param"), REFUSED)
def test_refused(value: JsonValue, param: str) -> None:
    with pytest.raises(RequestError) as refused:
        decode_mcp_messages(value)
    assert refused.value.param == param


RESULTS: list[Any] = [
    pytest.param({"output": "called:heads", "error": None}, False, "called:heads", id="output"),
    pytest.param(
        {"output": None, "error": {"type": "mcp_tool_execution_error", "content": "no such side"}},
        True,
        "no such side",
        id="tool-error",
    ),
    pytest.param(
        {"output": None, "error": {"type": "http_error", "code": 504, "message": "timed out"}},
        True,
        "timed out",
        id="server-failure",
    ),
]


@pytest.mark.parametrize(("done", "is_error", "text"), RESULTS)
def test_a_call_and_its_result_read_back_as_the_model_wrote_them(done: JsonObject, is_error: bool, text: str) -> None:
    use = use_block(ToolCall(index=0, id="call_ab12", name="flip", arguments='{"side": "heads"}'), "calc")
    assert use == {
        "type": "mcp_tool_use",
        "id": "mcptoolu_ab12",
        "name": "flip",
        "server_name": "calc",
        "input": {"side": "heads"},
    }
    result = result_block(use, done)
    assert result == {
        "type": "mcp_tool_result",
        "tool_use_id": "mcptoolu_ab12",
        "is_error": is_error,
        "content": [{"type": "text", "text": text}],
    }
    said: JsonObject = {"type": "text", "text": "Let me flip."}
    assert round_messages([said, use, result, {"type": "text", "text": "Heads."}]) == (
        Message(
            role=Role.ASSISTANT,
            content="Let me flip.",
            tool_calls=(ToolCallRecord(id="mcptoolu_ab12", name="flip", arguments='{"side": "heads"}'),),
        ),
        Message(role=Role.TOOL, content=f"Error: {text}" if is_error else text, tool_call_id="mcptoolu_ab12"),
        Message(role=Role.ASSISTANT, content="Heads."),
    )
