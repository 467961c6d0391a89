"""DeepSeek's DSML calls (V3.2, V4, V4.1): a block, `<｜DSML｜function_calls>` (V3.2),
`<｜DSML｜tool_calls>` (V4) or `<｜DSML｜ calls>` (V4.1, which writes a space after every `｜DSML｜`),
holding per call `<｜DSML｜invoke name="…">`, one
`<｜DSML｜parameter name="…" string="true|false">…</｜DSML｜parameter>` per argument (a string as
written, anything else as JSON) and `</｜DSML｜invoke>`. A call without arguments may close itself
(`<｜DSML｜invoke name="…"/>`, which SGLang reports V4 writing). `<think>` reasoning.

Each invoke is a call section and the block's tags are layout, so a block cut off inside its second
call still holds its first. Every dialect is read whatever the model; the template says which one a
forced call is written in (`detect`). A string argument streams as written, holding back what could
still be its closing tag; any other value goes out when its element closes.

`｜DSML｜` is one token of DeepSeek's vocabulary, but the tags around it are text and it recurs in
every tag, so no single token opens a call: calls are not held under `auto` (no `trigger`).
Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs

from pipeline.requests import Tool
from stages.families.base import (
    JSON_OPTIONS,
    Family,
    MarkerRef,
    ParsedCall,
    arguments_schema,
    json_object,
    lark_text,
    raw_lark,
)
from stages.families.progress import CallProgress
from stages.families.xml_params import INPUT, is_text
from stages.stops import partial_suffix

DSML = "｜DSML｜"


@attrs.frozen
class Dialect:
    """One version's DSML: its block's name, and what it writes after `｜DSML｜` in every tag."""

    block: str
    gap: str = ""

    def tag(self, name: str, *, closing: bool = False) -> str:
        """`<｜DSML｜name` (`</…` when closing), its attributes and `>` left to the caller."""
        return f"<{'/' if closing else ''}{DSML}{self.gap}{name}"


V32, V4, V41 = Dialect("function_calls"), Dialect("tool_calls"), Dialect("calls", gap=" ")
DIALECTS = (V32, V4, V41)
# Each dialect's invoke tags (V3.2's and V4's are the same).
CALLS = tuple(dict.fromkeys((d.tag("invoke") + " ", d.tag("invoke", closing=True) + ">") for d in DIALECTS))
BLOCKS = tuple(dict.fromkeys(d.tag(d.block, closing=closing) + ">" for d in DIALECTS for closing in (False, True)))
_NAME = re.compile(r'\s*name="([^"]+)"')
_OPEN = re.compile(rf'<{DSML} ?parameter name="([^"]*)" string="(true|false)">')
_CLOSE = re.compile(rf"</{DSML} ?parameter>")
_CLOSERS = tuple(d.tag("parameter", closing=True) + ">" for d in (V4, V41))
_NEXT_INVOKE = re.compile(rf"\s*<{DSML} ?invoke ")
_NEWLINE, _NEWLINE_END, _TEXT_ATTRIBUTE = "\n", ">\n", '" string="true">'
# What may follow a call that closed itself, at the end of its section: the block's end.
_TAIL = re.compile(rf"(?:\s*</{DSML} ?(?:{'|'.join(d.block for d in DIALECTS)})>)*\s*")


@attrs.frozen
class _Invoke:
    """A call as far as it is written: its arguments' canonical JSON without the closing brace."""

    name: str
    arguments: str
    whole: bool


def _invokes(body: str) -> list[_Invoke]:
    """The calls begun in an invoke section (the text after `<｜DSML｜invoke `): one, or, after a call
    that closed itself, the next invoke the section runs on into."""
    found: list[_Invoke] = []
    at = 0
    while (named := _NAME.match(body, at)) is not None:
        name, at = named.group(1), named.end()
        if body.startswith(">", at):
            arguments, whole = _parameters(body, at + 1)
            return [*found, _Invoke(name, arguments, whole)]
        if not body.startswith("/>", at):
            return [*found, _Invoke(name, "", False)]
        at += len("/>")
        following = _NEXT_INVOKE.match(body, at)
        if following is None:
            return [*found, _Invoke(name, "{", _TAIL.fullmatch(body, at) is not None)]
        found.append(_Invoke(name, "{", True))
        at = following.end()
    return found


def _parameters(body: str, at: int) -> tuple[str, bool]:
    """The arguments from `at` as canonical JSON so far (no closing brace), and whether they are whole:
    every parameter closed, and nothing but whitespace between and after them."""
    shown = "{"
    while True:
        opened = _OPEN.search(body, at)
        if opened is None or body[at : opened.start()].strip():
            return shown, not body[at:].strip()
        key = json.dumps(opened.group(1), ensure_ascii=False) + ": "
        head = shown + (", " if shown != "{" else "") + key
        textual = opened.group(2) == "true"
        closed = _CLOSE.search(body, opened.end())
        if closed is None:
            if not textual:
                return shown, False
            text = body[opened.end() :]
            return head + json.dumps(text[: len(text) - partial_suffix(text, _CLOSERS)], ensure_ascii=False)[:-1], False
        value: Any = body[opened.end() : closed.start()]
        if not textual:
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError):
                return shown, False
        shown, at = head + json.dumps(value, ensure_ascii=False), closed.end()


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    calls: list[ParsedCall] = []
    for invoke in _invokes(body):
        arguments = json_object(invoke.arguments + "}") if invoke.whole else None
        if arguments is None:
            return None
        calls.append((invoke.name, arguments))
    return calls or None


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    return [CallProgress(invoke.name, invoke.arguments) for invoke in _invokes(body)]


def forced(dialect: Dialect, tools: Sequence[Tool], marker: MarkerRef) -> str:
    """One call in `dialect`'s block, each argument held to its schema (`_value`). The block's end tag is left
    out (the call reads whole without it): it is text, so output cut by max tokens inside it would show its start."""
    rules: list[str] = []
    for index, tool in enumerate(tools):
        rules.extend(_invoke(dialect, tool, index, marker))
    choice = " | ".join(f"c{i}" for i in range(len(tools)))
    return f"start: {_tag(dialect, marker, dialect.block, _NEWLINE_END)} ({choice})\n" + "\n".join(rules)


def _tag(dialect: Dialect, marker: MarkerRef, name: str, rest: str, closing: bool = False) -> str:
    """A tag as Lark: `｜DSML｜` by token where it is one, the rest as text."""
    return f"{lark_text('</' if closing else '<')} {marker(DSML)} {lark_text(dialect.gap + name + rest)}"


def _invoke(dialect: Dialect, tool: Tool, index: int, marker: MarkerRef) -> list[str]:
    """Lark rules for one call to `tool`: `c<index>` and the rules of its values."""
    schema = arguments_schema(tool)
    declared = schema.get("properties")
    properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
    required = set(schema.get("required") or ())
    rules: list[str] = []
    parts = [_tag(dialect, marker, "invoke", f' name="{tool.name}">\n')]
    if tool.input_grammar is not None:
        # A custom tool's input is one text argument, held to its grammar as written: no JSON string to escape it into.
        parts.append(_tag(dialect, marker, "parameter", _attributes(INPUT, True)))
        parts.append(raw_lark(tool.input_grammar))
        parts.append(_tag(dialect, marker, "parameter", _NEWLINE_END, closing=True))
        properties = {}
    for number, (key, value_schema) in enumerate(properties.items()):
        textual, value = _value(dialect, marker, f"c{index}_p{number}", value_schema, rules)
        element = f"({_tag(dialect, marker, 'parameter', _attributes(key, textual))} {value})"
        parts.append(element if key in required else f"{element}?")
    if not properties and tool.input_grammar is None and schema.get("additionalProperties", True) is not False:
        # No declared parameters: any names, each value text.
        _, value = _value(dialect, marker, f"c{index}_v", None, rules)
        name_open = _tag(dialect, marker, "parameter", ' name="')
        rules.append(f"c{index}_any: {name_open} /[A-Za-z0-9_.-]+/ {lark_text(_TEXT_ATTRIBUTE)} {value}")
        parts.append(f"c{index}_any*")
    if tool.input_grammar is None and not required & set(properties):
        # DeepSeek's encoder writes an empty line in a call without arguments.
        parts.append(f"{lark_text(_NEWLINE)}?")
    parts.append(_tag(dialect, marker, "invoke", _NEWLINE_END, closing=True))
    return [f"c{index}: " + " ".join(parts), *rules]


def _attributes(key: str, textual: bool) -> str:
    return f' name="{key}" string="{"true" if textual else "false"}">'


def _value(dialect: Dialect, marker: MarkerRef, rule: str, schema: object, rules: list[str]) -> tuple[bool, str]:
    """Whether a value is written as text, and it with its closing tag as Lark: an enum of strings as its
    literals, a string as text up to the closing tag, anything else as `%json` of its schema."""
    dsml, end = marker(DSML), dialect.gap + "parameter" + _NEWLINE_END
    close = f"{lark_text('</')} {dsml} {lark_text(end)}"
    if not is_text(schema):
        json_schema = json.dumps({**schema, "x-guidance": JSON_OPTIONS}) if isinstance(schema, dict) else "{}"
        rules.append(f"{rule}: %json {json_schema}")
        return False, f"{rule} {close}"
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list) and enum:
        return True, f"({' | '.join(lark_text(str(item)) for item in enum)}) {close}"
    low = schema.get("minLength", 0) if isinstance(schema, dict) else 0
    high = schema.get("maxLength", "") if isinstance(schema, dict) else ""
    text = f"(?s:.{{{int(low)},{high}}})"
    if dsml.startswith("<["):
        # `｜DSML｜` one token: text never holds it, so the text runs to the `</` before it.
        rules.append(f"{rule}: /{text}<\\//")
        return True, f"{rule} {dsml} {lark_text(end)}"
    # The closing tag all text: the value is text up to its first one, and includes it.
    rules.append(f"{rule}[lazy]: /{text}{_regex_text(dialect.tag('parameter', closing=True) + '>')}/")
    return True, f"{rule} {lark_text(_NEWLINE)}"


def _regex_text(text: str) -> str:
    """`text` matched literally inside a Lark `/…/` regex."""
    return re.escape(text).replace("/", "\\/")


def family(dialect: Dialect) -> Family:
    """The family of a model whose template writes `dialect`: every dialect read, its own forced."""
    invoke = f'{dialect.tag("invoke")} name="<function-name>">'
    parameter = f'{dialect.tag("parameter")} name="<key>" string="true|false"><value>'
    return Family(
        name="deepseek_dsml",
        parse=parse,
        forced=partial(forced, dialect),
        example=(
            f"{dialect.tag(dialect.block)}>\n{invoke}\n{parameter}{dialect.tag('parameter', closing=True)}>\n"
            f"{dialect.tag('invoke', closing=True)}>\n{dialect.tag(dialect.block, closing=True)}>"
        ),
        think=("<think>", "</think>"),
        calls=CALLS,
        json_bodies=False,
        progress=progress,
        dropped=BLOCKS,
    )


FAMILIES = {dialect: family(dialect) for dialect in DIALECTS}
FAMILY = FAMILIES[V4]


def detect(template: str) -> Family:
    """The family of a model whose template writes DSML, in the dialect whose block its template names
    (`tool_calls>`, `function_calls>`, ` calls>`: no one of them inside another)."""
    return next((FAMILIES[d] for d in DIALECTS if f"{d.gap}{d.block}>" in template), FAMILY)
