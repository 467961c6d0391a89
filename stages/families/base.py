"""What a model family's output markup is, as the markup splitter and the
forced-call grammar read it.

A `Family` names the model's think markers, the markers that open and close a tool call (a closer of
None means the call runs to the next opener or to the end of the output, as when EOS ends it),
openers that count only at a message boundary (Llama's bare JSON), layout markers that are removed
from the answer and leave a boundary behind, a parser for one call section, a reader of an
unfinished one (so arguments stream), and the Lark grammar of a forced call in the family's own
markup; or, for output that is messages rather than text with markers in it (gpt-oss), a splitter of
its own. Pure; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs

from pipeline.events import CompletionEvent
from pipeline.requests import Constraint, ConstraintKind, Tool
from stages.families.progress import ProgressReader

# One parsed call: the tool's name and its arguments as a JSON object.
ParsedCall = tuple[str, dict[str, Any]]
# (opener, body, tools) -> the calls in the section, or None if it is not well formed.
CallParser = Callable[[str, str, Sequence[Tool]], list[ParsedCall] | None]
# A marker as Lark: by token id when it is one token of the vocabulary.
MarkerRef = Callable[[str], str]
# (allowed tools, marker ref) -> a Lark grammar whose `start` is the forced output.
ForcedGrammar = Callable[[Sequence[Tool], MarkerRef], str]


class Splitter(Protocol):
    """Completion events out of decoded text, fed as it streams (`stages/reply/markup.py`)."""

    @property
    def reasoning(self) -> bool: ...

    @property
    def tool_calls(self) -> int: ...

    def feed(self, text: str, *, final: bool = False, cut: bool = False) -> list[CompletionEvent]:
        """With `cut`, the output ended at max tokens: a call cut off ends with its arguments so far."""
        ...


# (offered tools, whether calls are parsed) -> a family's own splitter.
SplitterFactory = Callable[[tuple[Tool, ...], bool], Splitter]

# JSON as clients expect to read it, with no room for runs of whitespace.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class NotCarried(ValueError):
    """A custom tool's grammar that cannot be held inside the JSON string its input travels in."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"Invalid '{param}': {reason}")
        self.param = param


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
    # The marker a call (as `forced` writes it) opens with, where the model opens one freely (`lazy.py`).
    trigger: str | None = None
    # How far an unfinished call section's calls are written, so their arguments stream (`progress.py`);
    # None where a call is known only once its section is whole.
    progress: ProgressReader | None = None
    # (opener, body so far) -> whether the section's closer, met after the body, is text inside one of its
    # values (a markup whose values are raw text, `xml_params.py`); None where `json_bodies` decides.
    closer_inside: Callable[[str, str], bool] | None = None
    # Call openers that also end a reasoning section the model left open (Qwen3.5 may open a call without
    # closing the think block its prompt opened).
    reasoning_openers: tuple[str, ...] = ()
    # False where only the section's closer says a call is whole (GLM's calls have no end tag of their own):
    # a section the output ends inside, short of max tokens, holds no call.
    unclosed_calls: bool = True
    # Calls written inside the text (Gemma 4): the whitespace beside a call's markers is the model's text, not layout.
    inline_calls: bool = False


def lark_json(schema: dict[str, Any]) -> str:
    return f"%json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}"


# A custom tool's arguments around its input, written as `JSON_OPTIONS` lay JSON out.
_INPUT_OPEN, _INPUT_CLOSE = '{"input": "', '"}'


def _call_head(name: str, arguments_key: str) -> str:
    return "{" + f"{json.dumps('name')}: {json.dumps(name)}, {json.dumps(arguments_key)}: "


def lark_arguments(tool: Tool) -> str:
    """A call's arguments as Lark: the tool's JSON schema, or for a custom
    tool with a grammar `{"input": "…"}` with the input held to it."""
    if tool.input_grammar is None:
        return lark_json(arguments_schema(tool))
    return f"{lark_text(_INPUT_OPEN)} {input_lark(tool.input_grammar)} {lark_text(_INPUT_CLOSE)}"


def lark_calls(tools: Sequence[Tool], *, arguments_key: str = "arguments") -> str:
    """One `{"name": …, "arguments": …}` object for any of `tools`, as Lark."""
    if all(tool.input_grammar is None for tool in tools):
        return lark_json(any_of([call_object(tool, arguments_key=arguments_key) for tool in tools]))
    # Every option a literal head then its arguments: llguidance's lexer cannot
    # choose between a literal and a nested JSON grammar that start alike.
    options = [
        f"{lark_text(_call_head(tool.name, arguments_key))} {lark_arguments(tool)} {lark_text('}')}" for tool in tools
    ]
    return "(" + " | ".join(options) + ")"


def lark_call_list(tools: Sequence[Tool], *, most: int | None = 1) -> str:
    """A JSON list of calls (at least one; at most `most`), as Lark."""
    if all(tool.input_grammar is None for tool in tools):
        schema: dict[str, Any] = {
            "type": "array",
            "items": any_of([call_object(tool) for tool in tools]),
            "minItems": 1,
        }
        return lark_json(schema if most is None else {**schema, "maxItems": most})
    call = lark_calls(tools)
    return f'"[" {call} ' + ('("," " " ' + call + ")* " if most is None else "") + '"]"'


def input_lark(grammar: Constraint) -> str:
    """A nested Lark grammar for a custom tool's input as it reads inside a JSON string.

    Raises:
        NotCarried: the grammar cannot be carried into a JSON string (`json_image.py`).
    """
    from stages.families.json_image import json_string_lark, json_string_regex

    try:
        if grammar.kind is ConstraintKind.REGEX:
            inner = "start: " + json_string_regex(str(grammar.spec))
        else:
            inner = json_string_lark(str(grammar.spec))
    except ValueError as reason:
        raise NotCarried(grammar.param, str(reason)) from None
    return "%lark {\n" + inner + "\n}"


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


def raw_lark(grammar: Constraint) -> str:
    """A custom tool's grammar nested as it is (a regex as its one rule)."""
    if grammar.kind is ConstraintKind.REGEX:
        return "%lark {\nstart: /" + str(grammar.spec).replace("/", "\\/") + "/\n}"
    return "%lark {\n" + str(grammar.spec) + "\n}"
