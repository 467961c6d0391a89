"""Llama 4: pythonic calls, `[get_weather(city="Paris"), get_time()]` (`pythonic.py`), as the whole
answer, bare or between `<|python_start|>` and `<|python_end|>`; or the JSON call of Llama 3
(`{"name": …, "parameters": …}`), which the chat template Meta's repositories ship asks for.

A forced call is pythonic, Meta's documented format for Llama 4: each argument a Python literal
held to its schema (`True`/`False`/`None` for booleans and null; strings, numbers, lists and objects
as JSON writes them, which Python reads the same). A call the model opens itself under `auto` is
held after `<|python_start|>`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from keyword import iskeyword
from typing import Any

from pipeline.requests import Tool
from stages.families import llama3
from stages.families.base import Family, MarkerRef, ParsedCall, arguments_schema, input_lark, lark_json, lark_text
from stages.families.progress import CallProgress
from stages.families.pythonic import parse_calls, read_calls

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
# Llama 4's message header, which its template writes and Llama 3's does not.
HEADER = "<|header_start|>"
_LEADING = ("[", "{")


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    text = (opener if opener in _LEADING else "") + body
    if text.lstrip().startswith("{"):
        return llama3.parse("{", text.lstrip()[1:], tools)
    return parse_calls(text)


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    text = (opener if opener in _LEADING else "") + body
    if text.lstrip().startswith("{"):
        return llama3.progress("{", text.lstrip()[1:], tools)
    return read_calls(text)


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    """One call in a list.

    Raises:
        NotImplementedError: a tool's name, or an argument's, cannot be written in Python.
    """
    rules: list[str] = []
    for index, tool in enumerate(tools):
        rules.extend(_call(tool, index))
    return 'start: "[" (' + " | ".join(f"c{i}" for i in range(len(tools))) + ') "]"\n' + "\n".join(rules)


def _call(tool: Tool, index: int) -> list[str]:
    """Lark rules for one call to `tool`: `c<index>` and one rule per argument."""
    _python_name(tool.name, "the tool name")
    if tool.input_grammar is not None:
        # Its input as a JSON string's text inside a Python string: the escapes read the same in both.
        opening, closing = lark_text(f'{tool.name}(input="'), lark_text('")')
        return [f"c{index}: {opening} {input_lark(tool.input_grammar)} {closing}"]
    schema = arguments_schema(tool)
    declared = schema.get("properties")
    properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
    required = set(schema.get("required") or ())
    for key in properties:
        _python_name(key, f"{tool.name}'s argument")
    named = {key: f"c{index}_p{n}" for n, key in enumerate(properties)}
    rules = [f"{named[key]}: {lark_text(key + '=')} {_value(value)}" for key, value in properties.items()]
    firsts = [named[key] for key in properties if key in required]
    rest = [named[key] for key in properties if key not in required]
    if firsts:
        # The required arguments first (a keyword's place is free), then each optional one or not.
        arguments = " ".join([firsts[0], *(f'", " {rule}' for rule in firsts[1:]), *(f'(", " {r})?' for r in rest)])
    elif rest:
        options = [" ".join([rule, *(f'(", " {r})?' for r in rest[n + 1 :])]) for n, rule in enumerate(rest)]
        arguments = "(" + " | ".join(options) + ")?"
    elif schema.get("additionalProperties", True) is not False:
        rules.append(f'c{index}_any: /[A-Za-z_][A-Za-z0-9_]*/ "=" {lark_json({})}')
        arguments = f'(c{index}_any (", " c{index}_any)*)?'
    else:
        arguments = ""
    return [f"c{index}: {lark_text(tool.name + '(')} {arguments} {lark_text(')')}", *rules]


def _python_name(name: str, what: str) -> None:
    if not all(part.isidentifier() and not iskeyword(part) for part in name.split(".")):
        raise NotImplementedError(f"{what} {name!r} is no Python name, which pythonic calls are written with")


def _value(schema: object) -> str:
    """A value as its schema says, in Python: JSON's literals where Python's differ."""
    if not isinstance(schema, dict):
        return lark_json({})
    kind, enum = schema.get("type"), schema.get("enum")
    if isinstance(enum, list) and enum:
        return "(" + " | ".join(lark_text(_literal(item)) for item in enum) + ")"
    if kind == "boolean":
        return '("True" | "False")'
    if kind == "null":
        return '"None"'
    return lark_json(schema)


def _literal(value: object) -> str:
    """An enum's item as Python writes it."""
    if value is None or isinstance(value, bool):
        return {None: "None", True: "True", False: "False"}[value]
    return json.dumps(value)


FAMILY = Family(
    name="llama4",
    parse=parse,
    forced=forced,
    example="[<function-name>(<argument>=<value>, …)]",
    calls=((PYTHON_START, PYTHON_END),),
    leading=_LEADING,
    trigger=PYTHON_START,
    progress=progress,
)
