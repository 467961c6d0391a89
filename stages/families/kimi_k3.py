"""Kimi K3: XTML channels and calls (read by `kimi_k3_markup.py`), and the grammar of a forced call.

A forced call is written as the model writes one: one `argument` element per declared parameter in
the schema's order (the optional ones may be left out), a string's text up to the element's end (an
enum's as one of its literals), any other value as JSON held to its schema, its `type` attribute one
the schema allows. A custom tool's input, and the arguments of a tool that declares no parameters,
go in the call's `json` element, which the markup also takes. Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pipeline.requests import Tool
from stages.families.base import JSON_OPTIONS, Family, MarkerRef, arguments_schema, lark_arguments, lark_text
from stages.families.kimi_k3_markup import (
    ARGUMENT_CLOSE,
    CALL_CLOSE,
    CALL_OPEN,
    CLOSE,
    END,
    LAYOUT,
    OPEN,
    SEP,
    START,
    THINK,
    VOCABULARY,
    closer_inside,
    escape,
    parse,
    progress,
)
from stages.families.xml_params import is_text

__all__ = ["FAMILY", "THINK", "VOCABULARY", "forced"]

# A JSON-schema type and the XTML `type` a value of it is written with.
_XTML_TYPES = {
    "integer": "number",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "object",
    "array": "array",
}


def _open(marker: MarkerRef, tag: str) -> str:
    """An open tag whose name and attributes are `tag`, as Lark."""
    return f"{marker(OPEN)} {lark_text(tag)} {marker(SEP)}"


def _close(marker: MarkerRef, tag: str) -> str:
    return f"{marker(CLOSE)} {lark_text(tag)} {marker(SEP)}"


def _types(schema: object) -> list[str]:
    """The XTML types a non-string value of `schema` may be written as (any, where it names none)."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = kind if isinstance(kind, list) else [kind]
    named = {_XTML_TYPES[k] for k in kinds if isinstance(k, str) and k in _XTML_TYPES}
    return sorted(named or set(_XTML_TYPES.values()))


def _text_value(rule: str, schema: object, rules: list[str], marker: MarkerRef) -> str:
    """A string's text and the element's end."""
    enum = schema.get("enum") if isinstance(schema, dict) else None
    if isinstance(enum, list) and enum:
        return f"({' | '.join(lark_text(str(item)) for item in enum)}) {_close(marker, 'argument')}"
    low = int(schema.get("minLength", 0)) if isinstance(schema, dict) else 0
    high = schema.get("maxLength", "") if isinstance(schema, dict) else ""
    if marker(CLOSE).startswith("<["):
        # `<|close|>` is one special token: text never holds it, so the text ends where it comes.
        rules.append(f"{rule}: /(?s:.{{{low},{high}}})/")
        return f"{rule} {_close(marker, 'argument')}"
    rules.append(f"{rule}[lazy]: /(?s:.{{{low},{high}}}){re.escape(ARGUMENT_CLOSE)}/")
    return rule


def _argument(key: str, schema: object, rule: str, rules: list[str], marker: MarkerRef) -> str:
    """One `argument` element for the parameter `key`, as Lark."""
    head = f'argument key="{escape(key)}"'
    if is_text(schema):
        opener = _open(marker, head + ' type="string"')
        return f"({opener} {_text_value(rule, schema, rules, marker)})"
    heads = " | ".join(lark_text(f'{head} type="{kind}"') for kind in _types(schema))
    value: dict[str, Any] = schema if isinstance(schema, dict) else {}
    rules.append(f"{rule}: %json {json.dumps({**value, 'x-guidance': JSON_OPTIONS})}")
    return f"({marker(OPEN)} ({heads}) {marker(SEP)} {rule} {_close(marker, 'argument')})"


def _call(tool: Tool, index: int, marker: MarkerRef) -> list[str]:
    """Lark rules for one call to `tool`: `c<index>` and one rule per value."""
    schema = arguments_schema(tool)
    declared = schema.get("properties")
    properties: dict[str, Any] = declared if isinstance(declared, dict) and tool.input_grammar is None else {}
    required = set(schema.get("required") or ())
    rules: list[str] = []
    parts = []
    for number, (key, value_schema) in enumerate(properties.items()):
        element = _argument(key, value_schema, f"c{index}_p{number}", rules, marker)
        parts.append(element if key in required else f"{element}?")
    if not properties:
        opener = _open(marker, 'json type="object"')
        block = f"{opener} {lark_arguments(tool)} {_close(marker, 'json')}"
        parts.append(block if tool.input_grammar is not None else f"({block})?")
    head = _open(marker, f'call tool="{escape(tool.name)}" index="1"')
    return [f"c{index}: " + " ".join([head, *parts, _close(marker, "call")]), *rules]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    rules = [rule for index, tool in enumerate(tools) for rule in _call(tool, index, marker)]
    choice = " | ".join(f"c{i}" for i in range(len(tools)))
    return f"start: {_open(marker, 'tools')} ({choice}) {_close(marker, 'tools')}\n" + "\n".join(rules)


FAMILY = Family(
    name="kimi_k3",
    parse=parse,
    forced=forced,
    example=(
        f'{START}{CALL_OPEN} tool="<function-name>" index="1"{SEP}'
        f'{OPEN}argument key="<key>" type="<json-type>"{SEP}<value>{ARGUMENT_CLOSE}{CALL_CLOSE}{END}'
    ),
    think=THINK,
    calls=((START, END),),
    dropped=LAYOUT,
    json_bodies=False,
    trigger=START,
    progress=progress,
    closer_inside=closer_inside,
    # The response channel or the calls opened without the think channel's end: the model skipped it.
    reasoning_openers=(LAYOUT[0], START),
)
