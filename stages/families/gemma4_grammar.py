"""A forced Gemma 4 call as Lark for llguidance: `<|tool_call>call:NAME{…}<tool_call|>`, its arguments in
Gemma's object notation (`gemma4_notation.py`) and held to the tool's JSON schema.

llguidance's `%json` writes JSON only, so the notation is written here from the schema, laid out as
the chat template lays out the calls it renders (the model's own habit): keys bare and in Jinja's
`dictsort` order (case-insensitive), strings between `<|"|>` tokens, no whitespace. What the
grammar holds: each declared property with its schema, required ones present and the others
optional; `type` (or a list of types), `enum`, `const`, `anyOf` / `oneOf`; a string's `minLength`
and `maxLength`; an array's `items` and a `minItems` of one or more; nested objects alike. What it
does not: `pattern`, `format`, number bounds, `maxItems` (and a `minItems` above one),
`uniqueItems`, `$ref`, `allOf`, `not` (those values are any notation value, or what their other
keywords say), and keys an object's schema leaves open beside declared ones (only the declared
ones are written; an object with none declared takes any keys). A custom tool's input is the
string of `{input:…}`, held to its grammar as written: the notation escapes nothing. Pure; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from pipeline.requests import Tool
from stages.families.base import MarkerRef, arguments_schema, lark_text, raw_lark
from stages.families.gemma4_notation import QUOTE

_INTEGER = r"/-?(0|[1-9][0-9]*)/"
_NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"
# Any value, for a schema that says nothing the grammar can hold.
_ANY_RULES = (
    'g_value: g_string | {number} | "true" | "false" | "null" | g_object | g_array',
    'g_object: "{{" (g_member ("," g_member)*)? "}}"',
    r'g_member: /[A-Za-z_$][A-Za-z0-9_.$-]*/ ":" g_value',
    'g_array: "[" (g_value ("," g_value)*)? "]"',
    "g_string: {string}",
)


@attrs.define
class NotationGrammar:
    """Lark rules for values in Gemma's notation, named `r<n>` (and `g_*` for any value) as they are needed."""

    marker: MarkerRef
    rules: list[str] = attrs.field(factory=list)
    _count: int = attrs.field(default=0, init=False)
    _any: bool = attrs.field(default=False, init=False)

    def rule(self, expression: str) -> str:
        self._count += 1
        self.rules.append(f"r{self._count}: {expression}")
        return f"r{self._count}"

    def value(self, schema: object) -> str:
        """A Lark expression for one value that `schema` allows."""
        if not isinstance(schema, dict):
            return self.any()
        if "const" in schema:
            return self.literal(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return "(" + " | ".join(self.literal(item) for item in schema["enum"]) + ")"
        options = schema.get("anyOf", schema.get("oneOf"))
        if isinstance(options, list) and options:
            # Each option as it reads beside the schema's other keywords.
            rest = {key: value for key, value in schema.items() if key not in ("anyOf", "oneOf")}
            choices = [self.value({**rest, **option}) for option in options if isinstance(option, dict)]
            return "(" + " | ".join(choices) + ")" if choices else self.any()
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return "(" + " | ".join(self.value({**schema, "type": one}) for one in kind) + ")"
        return self._typed(schema, kind)

    def _typed(self, schema: dict[str, Any], kind: object) -> str:
        if kind == "string":
            return self.string(schema.get("minLength", 0), schema.get("maxLength"))
        if kind in ("integer", "number"):
            return _INTEGER if kind == "integer" else _NUMBER
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind == "array":
            return self.array(schema)
        if kind == "object" or (kind is None and isinstance(schema.get("properties"), dict)):
            return self.mapping(schema)
        return self.any()

    def string(self, low: object = 0, high: object = None) -> str:
        quote = self.marker(QUOTE)
        bounds = f"{int(low) if isinstance(low, int) else 0},{high if isinstance(high, int) else ''}"
        if quote.startswith("<["):
            # The quote is one special token, which text never holds: the text ends where it comes.
            return self.rule(f"{quote} /(?s:.{{{bounds}}})/ {quote}")
        # A quote in text: the text is everything up to the first one, and includes it.
        text = self.rule_lazy(f'/(?s:.{{{bounds}}})<\\|"\\|>/')
        return f"{quote} {text}"

    def rule_lazy(self, expression: str) -> str:
        self._count += 1
        self.rules.append(f"r{self._count}[lazy]: {expression}")
        return f"r{self._count}"

    def array(self, schema: dict[str, Any]) -> str:
        item = self.rule(self.value(schema.get("items")))
        least = schema.get("minItems", 0)
        items = f'{item} ("," {item})*'
        return f'"[" {items} "]"' if isinstance(least, int) and least > 0 else f'"[" ({items})? "]"'

    def mapping(self, schema: dict[str, Any]) -> str:
        """`{…}` with the declared properties in `dictsort` order, the required ones present."""
        declared = schema.get("properties")
        properties: dict[str, Any] = declared if isinstance(declared, dict) else {}
        if not properties:
            return '"{" "}"' if schema.get("additionalProperties", True) is False else self.any("g_object")
        required = set(schema.get("required") or ())
        keys = sorted(properties, key=str.lower)
        members = [self.rule(f"{lark_text(f'{key}:')} {self.value(properties[key])}") for key in keys]
        return '"{" ' + self.members(members, [key in required for key in keys]) + ' "}"'

    def members(self, members: Sequence[str], required: Sequence[bool]) -> str:
        """The members in order, a comma between two written, the optional ones left out or not."""
        # tails[i]: the members from i on, after one already written (each then comes with its comma); none before the
        # first is needed.
        tails = [""] * (len(members) + 1)
        for index in range(len(members) - 1, 0, -1):
            written = f'"," {members[index]}' if required[index] else f'("," {members[index]})?'
            tails[index] = self.rule(f"{written} {tails[index + 1]}".strip())
        first_required = next((index for index, needed in enumerate(required) if needed), None)
        # The first member written: any optional one before the first required one, or that one.
        firsts = range(len(members) if first_required is None else first_required + 1)
        options = " | ".join(f"{members[index]} {tails[index + 1]}".strip() for index in firsts)
        return f"({options})" + ("?" if first_required is None else "")

    def literal(self, value: object) -> str:
        """One value exactly, as the template writes it."""
        if isinstance(value, str):
            quote = self.marker(QUOTE)
            return f"{quote} {lark_text(value)} {quote}" if value else f"{quote} {quote}"
        if isinstance(value, list):
            return '"[" ' + ' "," '.join(self.literal(item) for item in value) + ' "]"'
        if isinstance(value, dict):
            members = [f"{lark_text(f'{key}:')} {self.literal(value[key])}" for key in sorted(value, key=str.lower)]
            return '"{" ' + ' "," '.join(members) + ' "}"'
        return lark_text(json.dumps(value))

    def any(self, rule: str = "g_value") -> str:
        """Any value (or with `rule`, one of the `g_*` kinds), its rules written once."""
        if not self._any:
            self._any = True
            string = self.string()
            self.rules.extend(line.format(number=_NUMBER, string=string) for line in _ANY_RULES)
        return rule


def forced_calls(tools: Sequence[Tool], marker: MarkerRef, start: str, end: str) -> str:
    """`start: START (c0 | c1 …) END`, one `c<i>` per tool: `call:NAME{…}`."""
    grammar = NotationGrammar(marker)
    calls = [f"c{index}: {_call(tool, grammar)}" for index, tool in enumerate(tools)]
    choice = " | ".join(f"c{index}" for index in range(len(tools)))
    return "\n".join([f"start: {marker(start)} ({choice}) {marker(end)}", *calls, *grammar.rules])


def _call(tool: Tool, grammar: NotationGrammar) -> str:
    head = lark_text(f"call:{tool.name}")
    if tool.input_grammar is not None:
        quote = grammar.marker(QUOTE)
        return f'{head} "{{input:" {quote} {raw_lark(tool.input_grammar)} {quote} "}}"'
    schema = arguments_schema(tool)
    if schema.get("type", "object") != "object":
        return f"{head} {grammar.any()}"
    return f"{head} {grammar.mapping(schema)}"
