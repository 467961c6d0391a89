"""Calls written one element per parameter (Qwen3-Coder's `<function=…>`,
GLM's `<arg_key>/<arg_value>`, MiniMax's `<invoke>`): each value is text,
read as its JSON-schema type says (a string as it is, anything else as
JSON), so a call's JSON arguments are built as it is written.

`XmlMarkup` says how a family lays a call out. From it come the parser,
the progress reader (the arguments' JSON so far: a string parameter's
text streams as written, holding back what could still be its closing tag
or the whitespace stripped around it; any other value once its element
closes) and the forced grammar, whose values follow their schema: an
enum of strings as its literals, a string as text up to the closing tag,
anything else as `%json`. Pure; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from pipeline.requests import Constraint, ConstraintKind, Tool
from stages.families.base import JSON_OPTIONS, Family, MarkerRef, ParsedCall, arguments_schema, lark_text
from stages.families.progress import CallProgress

# The parameter a custom tool's input travels in, as `wire/responses_tools.py` names it.
INPUT = "input"


@attrs.frozen(kw_only=True)
class XmlMarkup:
    """One call's layout: `name_open NAME name_end … (key_open KEY key_end value_open VALUE value_end)* call_end`."""

    name_open: str
    name_end: str
    key_open: str
    key_end: str
    value_open: str
    value_end: str
    call_end: str
    # The layout the grammar writes: after the section's opener, the name, a key, a value and the call,
    # and on each side of a value.
    start_gap: str = ""
    name_gap: str = ""
    key_gap: str = ""
    value_gap: str = "\n"
    call_gap: str = ""
    pad: str = ""
    # How a value's surrounding whitespace is trimmed: one newline each side, or all of it.
    trim_newline_only: bool = False
    # A parameter the schema does not declare is text (else it is read as JSON where it parses).
    undeclared_text: bool = True


def _properties(tools: Sequence[Tool], name: str) -> dict[str, Any] | None:
    tool = next((tool for tool in tools if tool.name == name), None)
    properties = arguments_schema(tool).get("properties") if tool is not None else None
    return properties if isinstance(properties, dict) else None


def is_text(schema: object, undeclared_text: bool = True) -> bool:
    """A parameter whose value is written as plain text (a JSON string) rather than as JSON."""
    if not isinstance(schema, dict):
        return undeclared_text
    kind = schema.get("type")
    if kind is None:
        enum = schema.get("enum")
        return isinstance(enum, list) and bool(enum) and all(isinstance(value, str) for value in enum)
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


def _convert(text: str, textual: bool) -> Any:
    if textual:
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return {"true": True, "false": False, "none": None}.get(text.strip().lower(), text)


def _trim(markup: XmlMarkup, text: str) -> str:
    if not markup.trim_newline_only:
        return text.strip()
    text = text.removeprefix("\n")
    return text.removesuffix("\n")


def _shown(markup: XmlMarkup, text: str) -> str:
    """An unfinished text value as far as it is final: its leading trim done, a possible
    closing tag and the whitespace the end may trim held back."""
    text = text.removeprefix("\n") if markup.trim_newline_only else text.lstrip()
    for size in range(min(len(text), len(markup.value_end) - 1), 0, -1):
        if markup.value_end.startswith(text[-size:]):
            text = text[:-size]
            break
    return text.removesuffix("\n") if markup.trim_newline_only else text.rstrip()


def read_call(markup: XmlMarkup, body: str, tools: Sequence[Tool]) -> tuple[CallProgress | None, bool]:
    """The call in `body` as far as it is written, and whether it is whole."""
    start = body.find(markup.name_open) if markup.name_open else len(body) - len(body.lstrip())
    if start < 0:
        return None, False
    start += len(markup.name_open)
    ends = [index for index in (body.find(markup.name_end, start), body.find(markup.key_open, start)) if index >= 0]
    if not ends:
        return None, False
    name = body[start : min(ends)].strip()
    if not name:
        return None, False
    properties = _properties(tools, name) or {}
    shown, at = "{", min(ends)
    while True:
        key_at = body.find(markup.key_open, at)
        closed = body.find(markup.call_end, at) if markup.call_end else -1
        if key_at < 0 or 0 <= closed < key_at:
            # Without an end tag of its own (GLM) a call ends with its section: the parser closes it.
            return CallProgress(name, shown + "}" if closed >= 0 else shown), closed >= 0
        key_start = key_at + len(markup.key_open)
        key_end = body.find(markup.key_end, key_start)
        if key_end < 0:
            return CallProgress(name, shown), False
        key = body[key_start:key_end].strip()
        shown += (", " if shown != "{" else "") + json.dumps(key, ensure_ascii=False) + ": "
        value_at = (
            body.find(markup.value_open, key_end + len(markup.key_end))
            if markup.value_open
            else key_end + len(markup.key_end)
        )
        if value_at < 0:
            return CallProgress(name, shown), False
        value_start = value_at + len(markup.value_open)
        value_end = body.find(markup.value_end, value_start)
        textual = is_text(properties.get(key), markup.undeclared_text)
        if value_end < 0:
            if textual:
                shown += '"' + json.dumps(_shown(markup, body[value_start:]), ensure_ascii=False)[1:-1]
            return CallProgress(name, shown), False
        value = _convert(_trim(markup, body[value_start:value_end]), textual)
        shown += json.dumps(value, ensure_ascii=False)
        at = value_end + len(markup.value_end)


def parse_call(markup: XmlMarkup, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    call, whole = read_call(markup, body, tools)
    if call is None or call.name is None:
        return None
    text = call.arguments
    if not whole:
        # A call without an end tag of its own ends with its section: whole if its last value closed.
        if markup.call_end or not text:
            return None
        text += "}"
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError:
        return None
    return [(call.name, arguments)] if isinstance(arguments, dict) else None


def forced_call(markup: XmlMarkup, tool: Tool, index: int, marker: MarkerRef) -> list[str]:
    """Lark rules for one call to `tool`: `c<index>` and one rule per text value."""

    def literal(text: str) -> str:
        return marker(text) if text else ""

    schema = arguments_schema(tool)
    declared = schema.get("properties")
    properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
    required = set(schema.get("required") or ())
    rules: list[str] = []
    parts = [literal(markup.name_open), lark_text(tool.name), literal(markup.name_end), literal(markup.name_gap)]
    if tool.input_grammar is not None:
        # A custom tool's input is one text value, held to its grammar as written: no JSON string to escape it into.
        value = " ".join(marker(text) for text in (markup.value_open, markup.pad, "") if text)
        close = " ".join(marker(text) for text in (markup.pad, markup.value_end) if text)
        parts.append(_element(markup, lark_text(INPUT), f"{value} {_raw_lark(tool.input_grammar)} {close}", literal))
        properties = {}
    for number, (key, value_schema) in enumerate(properties.items()):
        element = _element(
            markup, lark_text(key), _value(markup, f"c{index}_p{number}", value_schema, rules, marker), literal
        )
        parts.append(element if key in required else f"({element})?")
    if not properties and tool.input_grammar is None and schema.get("additionalProperties", True) is not False:
        # No declared parameters: any keys, each value text.
        rules.append(
            f"c{index}_any: "
            + _element(markup, "/[A-Za-z0-9_.-]+/", _value(markup, f"c{index}_v", None, rules, marker), literal)
        )
        parts.append(f"c{index}_any*")
    parts += [literal(markup.call_end), literal(markup.call_gap)]
    return [f"c{index}: " + " ".join(part for part in parts if part), *rules]


def _element(markup: XmlMarkup, key: str, value: str, literal: Callable[[str], str]) -> str:
    parts = [
        literal(markup.key_open),
        key,
        literal(markup.key_end),
        literal(markup.key_gap),
        value,
        literal(markup.value_gap),
    ]
    return "(" + " ".join(part for part in parts if part) + ")"


def _value(markup: XmlMarkup, rule: str, schema: object, rules: list[str], marker: MarkerRef) -> str:
    """A value and its closing tag, as its schema says it is written (no schema: text)."""
    opener = " ".join(marker(text) for text in (markup.value_open, markup.pad) if text)
    close = " ".join(marker(text) for text in (markup.pad, markup.value_end) if text)
    if not is_text(schema):
        json_schema = json.dumps({**schema, "x-guidance": JSON_OPTIONS}) if isinstance(schema, dict) else "{}"
        rules.append(f"{rule}: %json {json_schema}")
        return f"{opener} {rule} {close}"
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list) and enum:
        return f"{opener} ({' | '.join(lark_text(str(item)) for item in enum)}) {close}"
    low = schema.get("minLength", 0) if isinstance(schema, dict) else 0
    high = schema.get("maxLength", "") if isinstance(schema, dict) else ""
    if marker(markup.value_end).startswith("<["):
        text = f"/(?s:.{{{int(low)},{high}}})/"
        # A closing tag that is one special token: text never holds it, so the text ends where it comes.
        rules.append(f"{rule}: {text}")
        return f"{opener} {rule} {close}"
    # A closing tag in text: the value is text up to its first one, and includes it.
    rules.append(f"{rule}[lazy]: /(?s:.{{{int(low)},{high}}}){_regex_text(markup.pad + markup.value_end)}/")
    return f"{opener} {rule}"


def _regex_text(text: str) -> str:
    """`text` matched literally inside a Lark `/…/` regex."""
    return "".join("\\n" if char == "\n" else "\\" + char if char in "\\.+*?()|[]{}^$/" else char for char in text)


def forced_calls(markup: XmlMarkup, tools: Sequence[Tool], marker: MarkerRef, start: str, end: str) -> str:
    rules: list[str] = []
    for index, tool in enumerate(tools):
        rules.extend(forced_call(markup, tool, index, marker))
    choice = " | ".join(f"c{i}" for i in range(len(tools)))
    gap = f" {marker(markup.start_gap)}" if markup.start_gap else ""
    return f"start: {marker(start)}{gap} ({choice}) {marker(end)}\n" + "\n".join(rules)


def _raw_lark(grammar: Constraint) -> str:
    """A custom tool's grammar nested as it is (a regex as its one rule)."""
    if grammar.kind is ConstraintKind.REGEX:
        return "%lark {\nstart: /" + str(grammar.spec).replace("/", "\\/") + "/\n}"
    return "%lark {\n" + str(grammar.spec) + "\n}"


def xml_family(name: str, markup: XmlMarkup, *, start: str, end: str, example: str) -> Family:
    """A family whose calls are one element per parameter inside `start`…`end`, thinking in `<think>`."""

    def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
        return parse_call(markup, body, tools)

    def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
        call, _ = read_call(markup, body, tools)
        return [] if call is None else [call]

    def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
        return forced_calls(markup, tools, marker, start, end)

    return Family(
        name=name,
        parse=parse,
        forced=forced,
        example=example,
        think=("<think>", "</think>"),
        calls=((start, end),),
        json_bodies=False,
        trigger=start,
        progress=progress,
    )
