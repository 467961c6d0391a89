"""Responses tools → the tools a chat template is offered, and back.

Function tools pass through. A `custom` tool (freeform input, such as
Codex's `apply_patch`) is offered as a function with one string argument,
`input`, its grammar quoted in its description; its calls come back as
`custom_tool_call` items. A `namespace` tool is expanded into its member
tools under qualified names (`namespace.member`); calls to them carry the
namespace again. Hosted tools (web search, file search, code interpreter,
computer use, image generation) run on OpenAI's side, which this server
cannot do: they are not offered to the model, and the app logs them; a
`tool_choice` that forces one is a 400 naming it. Remote MCP tools
(`mcp`) are read by `wire.responses_mcp` and run by the edge. Any other
tool type is refused by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import attrs

from pipeline.errors import invalid, unsupported
from pipeline.requests import Constraint, ConstraintKind, JsonObject, JsonValue, Tool, ToolChoice, ToolChoiceMode
from wire.field_reads import as_list, as_object, as_str, named_tool, read_arguments, read_function, read_str

HOSTED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "computer",
        "computer_use",
        "computer_use_preview",
        "image_generation",
    }
)
# The argument a custom tool's input travels in, inside the model's tool-call markup.
INPUT = "input"
_INPUT_SCHEMA: JsonObject = {"type": "object", "properties": {INPUT: {"type": "string"}}, "required": [INPUT]}


@attrs.frozen(kw_only=True)
class ToolSpec:
    """What a qualified tool name stands for in the client's terms."""

    kind: str  # "function" or "custom"
    name: str
    namespace: str | None = None
    # A custom tool's grammar, as a constraint on its input.
    grammar: Constraint | None = None


@attrs.frozen(kw_only=True)
class ResponsesTools:
    tools: tuple[Tool, ...] = ()
    specs: Mapping[str, ToolSpec] = attrs.field(factory=dict)
    # Hosted tools in the request, not offered to the model.
    skipped: tuple[str, ...] = ()


def qualified(name: str, namespace: str | None) -> str:
    return name if namespace is None else f"{namespace}.{name}"


def read_tools(raw: JsonValue) -> ResponsesTools:
    if raw is None:
        return ResponsesTools()
    tools: list[Tool] = []
    specs: dict[str, ToolSpec] = {}
    skipped: list[str] = []
    for index, value in enumerate(as_list(raw, "tools")):
        param = f"tools[{index}]"
        item = as_object(value, param)
        kind = item.get("type")
        if kind == "mcp":
            continue  # wire/responses_mcp.py reads it
        if kind in HOSTED:
            skipped.append(str(kind))
        elif kind == "namespace":
            namespace = as_str(item.get("name"), f"{param}.name")
            for member_index, member in enumerate(as_list(item.get("tools"), f"{param}.tools")):
                _add(
                    tools,
                    specs,
                    as_object(member, f"{param}.tools[{member_index}]"),
                    f"{param}.tools[{member_index}]",
                    namespace,
                )
        else:
            _add(tools, specs, item, param, None)
    return ResponsesTools(tools=tuple(tools), specs=specs, skipped=tuple(skipped))


def _add(tools: list[Tool], specs: dict[str, ToolSpec], item: JsonObject, param: str, namespace: str | None) -> None:
    kind = item.get("type")
    if kind == "function":
        tool = read_function(item, param, schema_key="parameters")
        spec = ToolSpec(kind="function", name=tool.name, namespace=namespace)
    elif kind == "custom":
        tool, spec = _custom(item, param, namespace)
    else:
        raise unsupported(f"{param}.type")
    name = qualified(tool.name, namespace)
    if name in specs:
        raise invalid(f"Invalid '{param}.name': a tool named {name!r} is already defined.", param=f"{param}.name")
    tools.append(attrs.evolve(tool, name=name))
    specs[name] = spec


def _custom(item: JsonObject, param: str, namespace: str | None) -> tuple[Tool, ToolSpec]:
    name = as_str(item.get("name"), f"{param}.name")
    description = read_str(item, "description", param=f"{param}.description") or ""
    grammar = _grammar(item.get("format"), f"{param}.format")
    if grammar is not None:
        syntax = "Lark grammar" if grammar.kind is ConstraintKind.GRAMMAR else "regular expression"
        description += f"\n\nThe `{INPUT}` argument is freeform text that must match this {syntax}:\n{grammar.spec}"
    else:
        description += f"\n\nThe `{INPUT}` argument is freeform text."
    tool = Tool(name=name, description=description.strip(), parameters=_INPUT_SCHEMA, input_grammar=grammar)
    return tool, ToolSpec(kind="custom", name=name, namespace=namespace, grammar=grammar)


def _grammar(value: JsonValue, param: str) -> Constraint | None:
    if value is None:
        return None
    format_ = as_object(value, param)
    kind = format_.get("type")
    if kind == "text":
        return None
    if kind != "grammar":
        raise invalid(f"Invalid '{param}.type': {kind!r}; expected 'text' or 'grammar'.", param=f"{param}.type")
    syntax = format_.get("syntax")
    definition = as_str(format_.get("definition"), f"{param}.definition")
    if syntax == "lark":
        return Constraint(kind=ConstraintKind.GRAMMAR, spec=definition, param=f"{param}.definition")
    if syntax == "regex":
        return Constraint(kind=ConstraintKind.REGEX, spec=definition, param=f"{param}.definition")
    raise invalid(f"Invalid '{param}.syntax': {syntax!r}; expected 'lark' or 'regex'.", param=f"{param}.syntax")


@attrs.frozen(kw_only=True)
class Choice:
    """The tool choice for the template, and a custom tool whose whole output is its grammar-bound input."""

    choice: ToolChoice
    grammar_call: str | None = None


def read_tool_choice(raw: JsonValue, tools: ResponsesTools, *, mcp: bool = False) -> Choice:
    """`mcp`: the request has `mcp` tools, whose names are known once listed (edge/mcp_loop.py checks them)."""
    if raw is None or raw == "auto" or (isinstance(raw, dict) and raw.get("type") == "mcp" and mcp):
        # A forced MCP tool is chosen by the loop once its server is listed.
        return Choice(choice=ToolChoice())
    if raw == "none":
        return Choice(choice=ToolChoice(mode=ToolChoiceMode.NONE))
    kind = raw.get("type") if isinstance(raw, dict) else None
    if isinstance(raw, dict) and kind in HOSTED:
        raise invalid(
            f"Invalid 'tool_choice': the hosted tool {kind!r} cannot run on this server.", param="tool_choice.type"
        )
    if not tools.tools and not (mcp and raw == "required"):
        raise invalid("Invalid 'tool_choice': there are no function tools to choose from.", param="tool_choice")
    if raw == "required":
        return Choice(choice=ToolChoice(mode=ToolChoiceMode.REQUIRED))
    if isinstance(raw, dict) and kind in ("function", "custom"):
        name = qualified(
            as_str(raw.get("name"), "tool_choice.name"), read_str(raw, "namespace", param="tool_choice.namespace")
        )
        choice = named_tool(name, tools.tools, "tool_choice.name")
        spec = tools.specs[name]
        if spec.kind != kind:
            raise invalid(f"Invalid 'tool_choice': {name!r} is a {spec.kind} tool.", param="tool_choice.type")
        if spec.grammar is not None:
            # The whole output is the input, held to the tool's grammar.
            return Choice(choice=ToolChoice(), grammar_call=name)
        return Choice(choice=choice)
    raise invalid(
        "Invalid 'tool_choice': must be 'none', 'auto', 'required', a function or a custom tool.", param="tool_choice"
    )


def call_arguments(item: JsonObject, param: str) -> str:
    """The JSON arguments the template sees for a replayed call item."""
    if item.get("type") == "custom_tool_call":
        return json.dumps({INPUT: as_str(item.get("input"), f"{param}.input")}, ensure_ascii=False)
    return read_arguments(item.get("arguments", "{}"), f"{param}.arguments")


def custom_input(arguments: str) -> str:
    """A custom tool's input, from the JSON arguments the model wrote (as much as is whole, where they were cut off)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments if _INPUT_HEAD.match(arguments) is None else custom_input_so_far(arguments)
    if isinstance(value, dict) and isinstance(value.get(INPUT), str):
        return str(value[INPUT])
    return arguments


_INPUT_HEAD = re.compile(r'\{\s*"input"\s*:\s*"')


def custom_input_so_far(arguments: str) -> str:
    """The input that a custom call's unfinished arguments (`{"input": "…`) hold so far: what its stream's deltas carry.

    An escape that is not yet whole (or half of a surrogate pair) waits for the rest.
    """
    head = _INPUT_HEAD.match(arguments)
    text = arguments[head.end() :] if head is not None else ""
    decoded: list[str] = []
    at = 0
    while at < len(text) and text[at] != '"':
        if text[at] != "\\":
            decoded.append(text[at])
            at += 1
            continue
        size = 6 if text[at + 1 : at + 2] == "u" else 2
        if size == 6 and text[at + 2 : at + 3] in ("d", "D") and text[at + 3 : at + 4] in "89abAB":
            size = 12  # the high half of a surrogate pair: the low half comes with it
        if at + size > len(text):
            break
        try:
            decoded.append(json.loads(f'"{text[at : at + size]}"'))
        except json.JSONDecodeError:
            break
        at += size
    return "".join(decoded)
