"""Tools for a template that ignores them, as vLLM does for any model: the
tools and the family's call markup are described in a system message, and
earlier calls and their results are written as plain text turns that any
template renders (many templates refuse a `tool` role)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pipeline.requests import JsonObject, JsonValue, Message, Role, Tool
from stages.families.base import Family

_PROBE = "mlx_relay_probe_tool"


def template_ignores_tools(render: Any) -> bool:
    """True when the template's output does not mention a tool it was given.

    `render(messages, tools)` renders to text; a template that raises on
    the probe is taken to ignore tools as well.
    """
    tool = {"type": "function", "function": {"name": _PROBE, "description": "probe", "parameters": {"type": "object"}}}
    try:
        return _PROBE not in render([{"role": "user", "content": "hello"}], [tool])
    except Exception:  # noqa: BLE001 -- any template error means "no tool support"
        return True


def tool_preamble(family: Family, tools: Sequence[Tool], messages: Sequence[Message]) -> list[JsonObject]:
    rendered: list[JsonObject] = []
    for message in messages:
        rendered.append(_as_text(family, message))
    if not tools:
        return rendered
    text = _describe(family, tools)
    if rendered and rendered[0]["role"] == "system":
        rendered[0] = {"role": "system", "content": f"{_content(rendered[0]['content'])}\n\n{text}"}
    else:
        rendered.insert(0, {"role": "system", "content": text})
    return rendered


def _describe(family: Family, tools: Sequence[Tool]) -> str:
    signatures = "\n".join(json.dumps(_signature(tool), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more of these functions to assist with the user query:\n"
        f"{signatures}\n\nTo call a function, reply with:\n{family.example}"
    )


def _signature(tool: Tool) -> dict[str, Any]:
    signature: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        signature["description"] = tool.description
    signature["parameters"] = tool.parameters
    return signature


def _as_text(family: Family, message: Message) -> JsonObject:
    role = Role.SYSTEM if message.role is Role.DEVELOPER else message.role
    content = _content(message.content)
    if message.role is Role.TOOL:
        return {"role": "user", "content": f"Result of tool call {message.tool_call_id or ''}:\n{content}".strip()}
    for call in message.tool_calls:
        written = json.dumps({"name": call.name, "arguments": _arguments(call.arguments)}, ensure_ascii=False)
        content = f"{content}\n{written}" if content else written
    return {"role": role.value, "content": content}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _content(content: Any) -> str:
    return content if isinstance(content, str) else "" if content is None else str(content)


def template_tool(tool: Tool) -> JsonValue:
    """A tool as chat templates and mlx-lm's tool parsers read it: OpenAI's function shape."""
    # Key order is the client's usual one: templates print the tool as JSON.
    function: JsonObject = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.parameters
    return {"type": "function", "function": function}
