"""Anthropic's MCP connector: a Messages request's `mcp_servers`, and the blocks of the calls the edge runs.

With the beta `mcp-client-2025-04-04` a server is `{"type": "url", "url", "name", "authorization_token",
"tool_configuration": {"enabled", "allowed_tools"}}`; with `mcp-client-2025-11-20` an `mcp_toolset`
entry of `tools` (`mcp_server_name`, `default_config` and per-tool `configs`, each `enabled`) chooses a
server's tools. Either shape is read under either beta. A call the edge runs (edge/mcp_messages_loop.py)
is an `mcp_tool_use` block (`id`, `name`, `server_name`, `input`), its answer an `mcp_tool_result` block
(`tool_use_id`, `is_error`, `content` of text blocks). The token goes into the server's headers only
(wire/responses_mcp.py's `McpServer` keeps it out of its repr), never into a block. Pure (docs/STYLE.md,
"Pure wire").
"""

from __future__ import annotations

import attrs

from pipeline.errors import invalid, quote, unsupported
from pipeline.events import ToolCall
from pipeline.requests import ChatRequest, JsonObject, JsonValue, Message, Tool, ToolChoice
from wire.anthropic_requests import MCP_BETAS, assistant_turns, decode_messages, read_tool_choice
from wire.field_reads import as_body, as_list, as_object, as_str, read_str
from wire.partial_json import arguments_object
from wire.responses_mcp import McpServer

# The stop reason of a turn whose model still called MCP tools when the bound was reached: as Anthropic's
# server tools pause a long turn, the client may send the answer back to let the model go on.
PAUSED = "pause_turn"

# (the tool names kept, None for all; the tool names dropped) for one server.
Choice = tuple[frozenset[str] | None, frozenset[str]]


@attrs.frozen(kw_only=True)
class McpMessages:
    """A Messages request with the MCP connector: its chat, its servers, and its tool choice still to read."""

    chat: ChatRequest
    servers: tuple[McpServer, ...]
    # `tool_choice` as sent: it may name a server's tool, known once the servers are listed.
    tool_choice: JsonObject | None


def connector_beta(header: str) -> bool:
    """Whether an `anthropic-beta` header asks for the MCP connector."""
    return any(beta.strip() in MCP_BETAS for beta in header.split(","))


def decode_mcp_messages(value: JsonValue, *, interleaved_thinking: bool = False) -> McpMessages:
    """Raises: RequestError (400) for a body Messages refuses, or a server or toolset this server cannot serve."""
    chat = decode_messages(value, interleaved_thinking=interleaved_thinking, connector=True)
    if chat.continue_final:
        # A prefill would be continued by the first round only; the rounds after it answer anew.
        raise invalid(
            "messages: a final assistant message (a prefill) is not served with mcp_servers", param="messages"
        )
    body = as_body(value)
    toolsets = _toolsets(body.get("tools"))
    servers = _servers(body.get("mcp_servers"), toolsets)
    strays = sorted(set(toolsets) - {server.label for server in servers})
    if strays:
        raise invalid(f"tools: an mcp_toolset names the server {quote(strays[0])}, not in mcp_servers", param="tools")
    choice = body.get("tool_choice")
    return McpMessages(
        chat=chat, servers=servers, tool_choice=None if choice is None else as_object(choice, "tool_choice")
    )


def first_choice(request: McpMessages, tools: tuple[Tool, ...]) -> ToolChoice:
    """The first round's choice, read against every tool offered (the client's and the servers')."""
    if request.tool_choice is None:
        return ToolChoice()
    return read_tool_choice({"tool_choice": request.tool_choice}, tools)


def round_messages(content: list[JsonObject]) -> tuple[Message, ...]:
    """What the model reads of the rounds so far: the content made, read as a client sending it back is."""
    return tuple(assistant_turns(content, "content")) if content else ()


def use_block(call: ToolCall, server_name: str) -> JsonObject:
    return {
        "type": "mcp_tool_use",
        "id": "mcptoolu_" + call.id.removeprefix("call_"),
        "name": call.name,
        "server_name": server_name,
        "input": arguments_object(call.arguments or "{}"),
    }


def result_block(use: JsonObject, done: JsonObject) -> JsonObject:
    """The `mcp_tool_result` of `use`, from the finished `mcp_call` item (edge/mcp_tools.py) that ran it."""
    error = done.get("error")
    if isinstance(error, dict):
        said = error.get("content", error.get("message"))
        text = said if isinstance(said, str) else str(error)
    else:
        output = done.get("output")
        text = output if isinstance(output, str) else ""
    return {
        "type": "mcp_tool_result",
        "tool_use_id": use["id"],
        "is_error": error is not None,
        "content": [{"type": "text", "text": text}],
    }


def _servers(raw: JsonValue, toolsets: dict[str, Choice]) -> tuple[McpServer, ...]:
    servers: list[McpServer] = []
    for index, value in enumerate(as_list(raw, "mcp_servers")):
        param = f"mcp_servers.{index}"
        item = as_object(value, param)
        if item.get("type") != "url":
            raise invalid(f"{param}.type: Input should be 'url'", param=f"{param}.type")
        name = as_str(item.get("name"), f"{param}.name")
        if name in (server.label for server in servers):
            raise invalid(f"{param}.name: the server name {quote(name)} is used twice", param=f"{param}.name")
        configured = item.get("tool_configuration")
        if configured is not None and name in toolsets:
            raise invalid(
                f"{param}.tool_configuration: the server {quote(name)} also has an mcp_toolset; give one of them",
                param=f"{param}.tool_configuration",
            )
        allowed, denied = toolsets.get(name) or _configuration(configured, f"{param}.tool_configuration")
        token = read_str(item, "authorization_token", param=f"{param}.authorization_token")
        servers.append(
            McpServer(
                label=name,
                url=as_str(item.get("url"), f"{param}.url"),
                headers={"Authorization": f"Bearer {token}"} if token else {},
                allowed=allowed,
                denied=denied,
                # The connector has no approvals: the servers' tools run as the model calls them.
                approve_rest=False,
            )
        )
    return tuple(servers)


def _configuration(value: JsonValue, param: str) -> Choice:
    """2025-04-04's `tool_configuration`: `enabled` false offers none of the server's tools."""
    if value is None:
        return None, frozenset()
    configured = as_object(value, param)
    if not _enabled(configured, param):
        return frozenset(), frozenset()
    names = configured.get("allowed_tools")
    if names is None:
        return None, frozenset()
    listed = as_list(names, f"{param}.allowed_tools")
    return frozenset(as_str(name, f"{param}.allowed_tools.{i}") for i, name in enumerate(listed)), frozenset()


def _toolsets(raw: JsonValue) -> dict[str, Choice]:
    """2025-11-20's `mcp_toolset` tools by server name (the other tools are the decoder's)."""
    found: dict[str, Choice] = {}
    for index, value in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(value, dict) or value.get("type") != "mcp_toolset":
            continue
        param = f"tools.{index}"
        name = as_str(value.get("mcp_server_name"), f"{param}.mcp_server_name")
        if name in found:
            raise invalid(f"{param}: the server {quote(name)} has two mcp_toolsets", param=f"{param}.mcp_server_name")
        if value.get("tools") is not None:
            # A pinned listing comes from a listing block this server does not make.
            raise unsupported(f"{param}.tools")
        on = _enabled(as_object(value.get("default_config") or {}, f"{param}.default_config"), param)
        configs = as_object(value.get("configs") or {}, f"{param}.configs")
        switched = {
            tool: _enabled(as_object(config, f"{param}.configs.{tool}"), f"{param}.configs.{tool}")
            for tool, config in configs.items()
        }
        if on:
            found[name] = None, frozenset(tool for tool, enabled in switched.items() if not enabled)
        else:
            found[name] = frozenset(tool for tool, enabled in switched.items() if enabled), frozenset()
    return found


def _enabled(config: JsonObject, param: str) -> bool:
    """A config's `enabled` (default true); `defer_loading` needs a tool search this server has not."""
    if config.get("defer_loading") not in (None, False):
        raise unsupported(f"{param}.defer_loading")
    enabled = config.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise invalid(f"'{param}.enabled' must be a boolean", param=f"{param}.enabled")
    return enabled is not False
