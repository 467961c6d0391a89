"""The remote MCP servers a request names, called with the official `mcp` SDK: the allow-list, listing, calling.

The server makes these requests for a client, so every URL must start with a prefix of the
`MLX_RELAY_MCP_ALLOW` setting (default none: every `mcp` tool is a 400 naming the setting). A URL
ending in `/sse` is spoken to over the older SSE transport, any other over streamable HTTP; the SDK
follows redirects only within the endpoint's origin. Each listing and call has its own session,
bounded by a timeout, and a result is cut at a size cap. A failure is reported in the item
(`mcp_list_tools.error`, `mcp_call.error`), never raised: it fails that call, not the request.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import httpx
import structlog
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult, TextContent

from pipeline.errors import invalid
from pipeline.requests import JsonObject, JsonValue
from wire.responses_mcp import McpServer, finished_call, list_item

log = structlog.get_logger(stage="mcp")

# Seconds to connect, list, or run one call; a slow server fails that call alone.
TIMEOUT = 30.0
# Characters of a tool's output the model is given; the rest is cut, and the cut said.
RESULT_CAP = 64 * 1024


def allow_list(setting: str | None) -> tuple[str, ...]:
    return tuple(prefix.strip() for prefix in (setting or "").split(",") if prefix.strip())


def check_allowed(servers: Sequence[McpServer], allowed: Sequence[str], *, tools_param: str = "tools") -> None:
    """Raises: RequestError (400) naming the first server whose URL no allowed prefix starts."""
    for server in servers:
        if not any(server.url.startswith(prefix) for prefix in allowed):
            raise invalid(
                f"Invalid '{tools_param}': the MCP server {server.label!r} at {server.url!r} is not allowed here; "
                "the server's MLX_RELAY_MCP_ALLOW setting (--mcp-allow) lists the URL prefixes it may call.",
                param=tools_param,
            )


@asynccontextmanager
async def _session(server: McpServer) -> AsyncIterator[ClientSession]:
    if server.url.rstrip("/").endswith("/sse"):
        async with (
            sse_client(server.url, headers=dict(server.headers), timeout=TIMEOUT) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
        return
    async with (
        httpx.AsyncClient(headers=dict(server.headers), timeout=TIMEOUT) as http,
        streamable_http_client(server.url, http_client=http) as (read, write, _session_id),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def list_tools(server: McpServer) -> JsonObject:
    """The `mcp_list_tools` item for `server`: its tools (all of them; the loop filters), or an error."""
    try:
        with anyio.fail_after(TIMEOUT):
            async with _session(server) as session:
                listed = await session.list_tools()
    except Exception as error:  # noqa: BLE001 - any failure of a remote server is its item's error
        log.info("mcp.list_failed", server_label=server.label, error=_reason(error))
        return list_item(server.label, [], error=_reason(error))
    tools: list[JsonObject] = []
    for tool in listed.tools:
        entry: JsonObject = {"name": tool.name, "input_schema": tool.inputSchema, "description": tool.description}
        entry["annotations"] = tool.annotations.model_dump(exclude_none=True) if tool.annotations else None
        tools.append(entry)
    return list_item(server.label, tools)


async def call_tool(server: McpServer, item: JsonObject) -> JsonObject:
    """The `mcp_call` item with its output or error, once `server` has run it."""
    arguments = _arguments(item.get("arguments"))
    if isinstance(arguments, str):
        return finished_call(item, output=None, error=_protocol_error(-32602, arguments))
    started = time.monotonic()
    try:
        with anyio.fail_after(TIMEOUT):
            async with _session(server) as session:
                result = await session.call_tool(str(item["name"]), arguments)
    except Exception as error:  # noqa: BLE001 - any failure of a remote server is its call's error
        log.info("mcp.call_failed", server_label=server.label, tool=item["name"], error=_reason(error))
        return finished_call(item, output=None, error=_failure(error))
    log.info("mcp.called", server_label=server.label, tool=item["name"], seconds=round(time.monotonic() - started, 3))
    output = _capped(_text(result))
    if result.isError:
        return finished_call(item, output=None, error={"type": "mcp_tool_execution_error", "content": output})
    return finished_call(item, output=output, error=None)


def _arguments(raw: JsonValue) -> dict[str, object] | str:
    """The call's arguments as an object, or why they are not one."""
    try:
        value = json.loads(str(raw or "{}"))
    except json.JSONDecodeError:
        return "the arguments are not JSON"
    return value if isinstance(value, dict) else "the arguments are not a JSON object"


def _text(result: CallToolResult) -> str:
    parts = [
        part.text if isinstance(part, TextContent) else json.dumps(part.model_dump(mode="json"))
        for part in result.content
    ]
    if not parts and result.structuredContent is not None:
        return json.dumps(result.structuredContent, ensure_ascii=False)
    return "\n".join(parts)


def _capped(text: str) -> str:
    if len(text) <= RESULT_CAP:
        return text
    return text[:RESULT_CAP] + f"\n[output cut at {RESULT_CAP} characters of {len(text)}]"


def _failure(error: BaseException) -> JsonObject:
    leaf = _leaf(error)
    if isinstance(leaf, McpError):
        return _protocol_error(leaf.error.code, leaf.error.message)
    if isinstance(leaf, httpx.HTTPStatusError):
        return {"type": "http_error", "code": leaf.response.status_code, "message": _reason(leaf)}
    return {"type": "http_error", "code": 504 if isinstance(leaf, TimeoutError) else 502, "message": _reason(leaf)}


def _protocol_error(code: int, message: str) -> JsonObject:
    return {"type": "mcp_protocol_error", "code": code, "message": message}


def _leaf(error: BaseException) -> BaseException:
    # The SDK's task groups wrap a transport's failure in exception groups.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _reason(error: BaseException) -> str:
    leaf = _leaf(error)
    if isinstance(leaf, TimeoutError):
        return f"the MCP server did not answer within {TIMEOUT:g} s"
    return f"{type(leaf).__name__}: {leaf}"[:500]
