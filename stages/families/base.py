"""What a model family's output markup is, as the markup splitter and the
forced-call grammar read it.

A `Family` names the model's think markers, the markers that open and
close a tool call (a closer of None means the call runs to the next
opener or to the end of the output, as when EOS ends it), openers that
count only at a message boundary (Llama's bare JSON), layout markers that
are removed from the answer and leave a boundary behind, a parser for one
call section, and the Lark grammar of a forced call in the family's own
markup; or, for output that is messages rather than text with markers in
it (gpt-oss), a splitter of its own. Pure; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from pipeline.events import CompletionEvent
from pipeline.requests import Tool

# One parsed call: the tool's name and its arguments as a JSON object.
ParsedCall = tuple[str, dict[str, Any]]
# (opener, body, tools) -> the calls in the section, or None if it is not well formed.
CallParser = Callable[[str, str, Sequence[Tool]], list[ParsedCall] | None]
# A marker as Lark: by token id when it is one token of the vocabulary.
MarkerRef = Callable[[str], str]
# (allowed tools, marker ref) -> a Lark grammar whose `start` is the forced output.
ForcedGrammar = Callable[[Sequence[Tool], MarkerRef], str]



class Splitter(Protocol):
    """Completion events out of decoded text, fed as it streams (`stages/markup.py`)."""

    @property
    def reasoning(self) -> bool: ...

    @property
    def tool_calls(self) -> int: ...

    def feed(self, text: str, *, final: bool = False) -> list[CompletionEvent]: ...


# (offered tools, whether calls are parsed) -> a family's own splitter.
SplitterFactory = Callable[[tuple[Tool, ...], bool], Splitter]

# JSON as clients expect to read it, with no room for runs of whitespace.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@attrs.frozen(kw_only=True)
class Family:
    name: str
    parse: CallParser
    forced: ForcedGrammar
    # How one call looks, for the tool preamble of a template that ignores `tools`.
    example: str
    think: tuple[str, str] | None = None
    calls: tuple[tuple[str, str | None], ...] = ()
    leading: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    # False for a model with no call markup: its calls are parsed only when forced.
    auto_calls: bool = True
    # A call's body is JSON: a closer inside one of its strings is text.
    json_bodies: bool = True
    # The grammar for `tool_choice: required` where it differs from a named call's.
    forced_required: ForcedGrammar | None = None
    # A family whose output is not text with markers in it (gpt-oss's messages) reads it itself.
    splitter: SplitterFactory | None = None


def lark_json(schema: dict[str, Any]) -> str:
    return f"%json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}"


def lark_text(text: str) -> str:
    return json.dumps(text)


def arguments_schema(tool: Tool) -> dict[str, Any]:
    return dict(tool.parameters) if tool.parameters else {"type": "object"}


def call_object(tool: Tool, *, arguments_key: str = "arguments") -> dict[str, Any]:
    """The JSON schema of `{"name": <tool>, "arguments": {...}}`."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: arguments_schema(tool)},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def any_of(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def alternatives(tools: Sequence[Tool], rule: Callable[[Tool], str]) -> str:
    """`start: c0 | c1 …` with one rule per allowed tool."""
    rules = [f"c{i}: {rule(tool)}" for i, tool in enumerate(tools)]
    return "start: " + " | ".join(f"c{i}" for i in range(len(tools))) + "\n" + "\n".join(rules)


def json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def named_call(value: object) -> ParsedCall | None:
    """`{"name": …, "arguments"|"parameters": {…} or a JSON string}` as a call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = json_object(arguments)
    if not isinstance(arguments, dict):
        return None
    return value["name"], arguments


def json_calls(text: str) -> list[ParsedCall] | None:
    """One call object, or a list of them, as JSON text."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    items = value if isinstance(value, list) else [value]
    calls = [named_call(item) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def in_json_string(body: str) -> bool:
    """`body` ends inside a JSON string (counted from its first `{`)."""
    inside, escaped = False, False
    for char in body[max(body.find("{"), 0) if "{" in body else len(body) :]:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = inside
        elif char == '"':
            inside = not inside
    return inside
