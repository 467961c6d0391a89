"""Responses `mcp` tools: the request's remote MCP servers, and the output items of listing and calling them.

A tool `{"type": "mcp", "server_label", "server_url", "allowed_tools", "require_approval", "headers",
"server_description"}` names a server the edge calls (edge/mcp_loop.py). Here it is only read and
checked (pure, docs/STYLE.md, "Pure wire"); the items (`mcp_list_tools`, `mcp_call`,
`mcp_approval_request`) are built in OpenAI's shapes. `headers` never reach an item or the echo.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence

import attrs

from pipeline.errors import invalid, quote, unsupported
from pipeline.requests import JsonObject, JsonValue, Tool
from wire.field_reads import as_list, as_object, as_str, read_str

# Fields of an `mcp` tool that name a hosted connector rather than a URL this server could call.
_HOSTED_ONLY = ("connector_id", "tunnel_id", "defer_loading")


@attrs.frozen(kw_only=True)
class McpServer:
    """One `mcp` tool of a request: where its server is and what the model may do with it."""

    label: str
    url: str
    # Sent to the server on each request; never logged, stored or echoed.
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    description: str | None = None
    # Tool names the listing keeps (None: all); with `read_only`, only tools annotated read-only.
    allowed: frozenset[str] | None = None
    # Tool names the listing drops whatever `allowed` says (a Messages toolset's tools turned off).
    denied: frozenset[str] = frozenset()
    read_only: bool = False
    # Tool names that run without an approval, and those that always need one; `approve_rest` for the others.
    never: frozenset[str] = frozenset()
    always: frozenset[str] = frozenset()
    approve_rest: bool = True

    def needs_approval(self, name: str) -> bool:
        if name in self.never:
            return False
        return name in self.always or self.approve_rest

    def keeps(self, tool: JsonObject) -> bool:
        """Whether a listed tool passes `allowed_tools`."""
        name = tool.get("name")
        if (self.allowed is not None and name not in self.allowed) or name in self.denied:
            return False
        annotations = tool.get("annotations")
        return not self.read_only or (isinstance(annotations, dict) and annotations.get("readOnlyHint") is True)


@attrs.frozen(kw_only=True)
class McpChoice:
    """`tool_choice: {"type": "mcp", "server_label", "name"}`: the first round must call that server's tool."""

    label: str
    name: str | None


def is_mcp(item: JsonValue) -> bool:
    return isinstance(item, dict) and item.get("type") == "mcp"


def read_mcp_servers(raw: JsonValue) -> tuple[McpServer, ...]:
    """Raises: RequestError for an `mcp` tool this server cannot serve, named by its index."""
    servers: list[McpServer] = []
    for index, value in enumerate(as_list(raw or [], "tools")):
        if is_mcp(value):
            servers.append(_server(as_object(value, f"tools[{index}]"), f"tools[{index}]"))
    labels = [server.label for server in servers]
    for index, label in enumerate(labels):
        if label in labels[:index]:
            raise invalid(f"Invalid 'tools': the server_label {quote(label)} is used twice.", param="tools")
    return tuple(servers)


def _server(item: JsonObject, param: str) -> McpServer:
    for key in _HOSTED_ONLY:
        if item.get(key) is not None:
            raise unsupported(f"{param}.{key}")
    url = as_str(item.get("server_url"), f"{param}.server_url")
    headers = dict(as_object(item.get("headers") or {}, f"{param}.headers"))
    token = read_str(item, "authorization", param=f"{param}.authorization")
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    allowed, read_only = _allowed(item.get("allowed_tools"), f"{param}.allowed_tools")
    never, always, rest = _approval(item.get("require_approval"), f"{param}.require_approval")
    return McpServer(
        label=as_str(item.get("server_label"), f"{param}.server_label"),
        url=url,
        headers={str(k): as_str(v, f"{param}.headers.{k}") for k, v in headers.items()},
        description=read_str(item, "server_description", param=f"{param}.server_description"),
        allowed=allowed,
        read_only=read_only,
        never=never,
        always=always,
        approve_rest=rest,
    )


def _names(value: JsonValue, param: str) -> frozenset[str]:
    return frozenset(as_str(name, f"{param}[{i}]") for i, name in enumerate(as_list(value or [], param)))


def _flag(item: JsonObject, key: str, param: str) -> bool:
    value = item.get(key, False)
    if not isinstance(value, bool):
        raise invalid(f"'{param}' must be a boolean", param=param)
    return value


def _allowed(value: JsonValue, param: str) -> tuple[frozenset[str] | None, bool]:
    if value is None:
        return None, False
    if isinstance(value, list):
        return _names(value, param), False
    filter_ = as_object(value, param)
    names = filter_.get("tool_names")
    return (None if names is None else _names(names, f"{param}.tool_names")), bool(
        _flag(filter_, "read_only", f"{param}.read_only")
    )


def _approval(value: JsonValue, param: str) -> tuple[frozenset[str], frozenset[str], bool]:
    """(never, always, the rest need approval) from `require_approval`; OpenAI's default asks for every call."""
    if value is None or value == "always":
        return frozenset(), frozenset(), True
    if value == "never":
        return frozenset(), frozenset(), False
    filter_ = as_object(value, param)
    never = _names(as_object(filter_.get("never") or {}, f"{param}.never").get("tool_names"), f"{param}.never")
    always = _names(as_object(filter_.get("always") or {}, f"{param}.always").get("tool_names"), f"{param}.always")
    return never, always, True


def read_mcp_choice(raw: JsonValue) -> McpChoice | None:
    if not isinstance(raw, dict) or raw.get("type") != "mcp":
        return None
    return McpChoice(
        label=as_str(raw.get("server_label"), "tool_choice.server_label"),
        name=read_str(raw, "name", param="tool_choice.name"),
    )


def echoed_tool(item: JsonObject) -> JsonObject:
    """An `mcp` tool as the response repeats it: without its secrets."""
    return {key: value for key, value in item.items() if key not in ("headers", "authorization")}


def list_item(label: str, tools: Sequence[JsonObject], error: str | None = None) -> JsonObject:
    item: JsonObject = {
        "type": "mcp_list_tools",
        "id": f"mcpl_{uuid.uuid4().hex}",
        "server_label": label,
        "tools": list(tools),
    }
    if error is not None:
        item["error"] = error
    return item


def call_item(label: str, name: str, arguments: str, *, approval_request_id: str | None = None) -> JsonObject:
    """An `mcp_call` in progress; `finished_call` adds its output or error."""
    return {
        "type": "mcp_call",
        "id": f"mcp_{uuid.uuid4().hex}",
        "server_label": label,
        "name": name,
        "arguments": arguments,
        "approval_request_id": approval_request_id,
        "output": None,
        "error": None,
        "status": "in_progress",
    }


def finished_call(item: JsonObject, *, output: str | None, error: JsonObject | None) -> JsonObject:
    return {**item, "output": output, "error": error, "status": "failed" if error is not None else "completed"}


def approval_item(label: str, name: str, arguments: str) -> JsonObject:
    return {
        "type": "mcp_approval_request",
        "id": f"mcpr_{uuid.uuid4().hex}",
        "server_label": label,
        "name": name,
        "arguments": arguments,
    }


def offered(servers: Sequence[McpServer], listings: Mapping[str, JsonObject]) -> dict[str, tuple[McpServer, Tool]]:
    """The listed tools the model is offered, by name, with the server each belongs to (the first listing wins)."""
    tools: dict[str, tuple[McpServer, Tool]] = {}
    for server in servers:
        listing = listings.get(server.label, {})
        for raw in as_list(listing.get("tools") or [], "tools"):
            tool = as_object(raw, "tools")
            name = str(tool.get("name"))
            if name in tools or not server.keeps(tool):
                continue
            schema = tool.get("input_schema")
            description = tool.get("description")
            tools[name] = (
                server,
                Tool(
                    name=name,
                    description=description if isinstance(description, str) else None,
                    # Closed, as OpenAI's strict mode closes a schema: the arguments are the listed ones.
                    parameters={"additionalProperties": False, **schema} if isinstance(schema, dict) else {},
                    # The server checks its arguments: a call must match the schema to run.
                    strict=True,
                ),
            )
    return tools


def approval_responses(items: Sequence[JsonObject]) -> dict[str, bool]:
    """The `mcp_approval_response` items of a request's input: approve or not, by approval request id."""
    answers: dict[str, bool] = {}
    for index, item in enumerate(items):
        if item.get("type") == "mcp_approval_response":
            param = f"input[{index}]"
            answers[as_str(item.get("approval_request_id"), f"{param}.approval_request_id")] = _flag(
                item, "approve", f"{param}.approve"
            )
    return answers


def call_result_text(item: JsonObject) -> str:
    """What the model reads back for an `mcp_call`: its output, or its error as JSON."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    return json.dumps({"error": item.get("error")}, ensure_ascii=False)
