"""Calls written one element per parameter (Qwen3-Coder's `<function=…>`,
GLM's `<arg_key>/<arg_value>`, MiniMax's `<invoke>`): each value is text,
read as its JSON-schema type says (a string as it is, `null` where the
schema allows it, anything else as JSON), so a call's JSON arguments are
built as it is written.

A value is raw text, so a tag written inside it is text too: a value ends
at its closing tag only where the markup goes on after it (the next
parameter, the call's end, or the end of the section); Qwen3-Coder's, left
unclosed, also ends at a line that opens the next parameter or closes the
call. The section's own end marker inside a value is text
(`Family.closer_inside`), unless the output ends right after it.

`XmlMarkup` says how a family lays a call out. From it come the parser
(every call of a section), the progress reader (the arguments' JSON so
far: a string parameter's text streams as written, holding back what could
still end it or be the whitespace trimmed around it; any other value once
its element closes) and the forced grammar, whose values follow their
schema: an enum of strings as its literals, a string as text up to the
closing tag, anything else as `%json`. Pure; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from pipeline.requests import Tool
from stages.families.base import JSON_OPTIONS, Family, MarkerRef, ParsedCall, arguments_schema, lark_text, raw_lark
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
    # How a value's surrounding whitespace is trimmed: all of it, one newline each side, or none.
    trim: str = "all"
    # A parameter the schema does not declare is text (else it is read as JSON where it parses).
    undeclared_text: bool = True


@attrs.frozen
class _Call:
    name: str
    # The arguments' canonical JSON so far: whole (closed with `}`) once the call is.
    arguments: str
    whole: bool


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


def _nullable(schema: object) -> bool:
    """The schema allows `null` (a text parameter's `null` is then JSON's)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind) or schema.get("nullable") is True:
        return True
    if isinstance(schema.get("enum"), list) and None in schema["enum"]:
        return True
    return any(_nullable(option) for key in ("anyOf", "oneOf") for option in schema.get(key) or ())


def _convert(text: str, schema: object, undeclared_text: bool) -> Any:
    if is_text(schema, undeclared_text):
        return None if text == "null" and _nullable(schema) else text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return {"true": True, "false": False, "none": None}.get(text.strip().lower(), text)


def _trim(markup: XmlMarkup, text: str) -> str:
    """A value's text without the whitespace around it (unfinished, also without trailing whitespace
    its end may yet trim)."""
    if markup.trim == "newline":
        return text.removeprefix("\n").removesuffix("\n")
    return text.strip() if markup.trim == "all" else text


def _shown(markup: XmlMarkup, text: str, schema: object) -> str:
    """An unfinished value's JSON as far as it is final: a text value's opening quote and text
    (none while it may still be a `null` its schema allows), nothing for any other value."""
    if not is_text(schema, markup.undeclared_text):
        return ""
    text = _trim(markup, text)
    if _nullable(schema) and "null".startswith(text):
        return ""
    return '"' + json.dumps(text, ensure_ascii=False)[1:-1]


def _patterns(markup: XmlMarkup, closer: str) -> list[str]:
    """What may end a value: its closing tag; unclosed, a line that opens the next parameter or closes
    the call (where values sit on lines of their own); the section's end marker, at the end of the output."""
    lined = [markup.pad + markup.key_open, markup.pad + markup.call_end] if markup.pad and markup.call_end else []
    return [pattern for pattern in (markup.value_end, *lined, closer) if pattern]


def _ends(markup: XmlMarkup, pattern: str, rest: str, closer: str, final: bool) -> bool | None:
    """Whether `pattern`, followed by `rest`, ends the value; None while the text to come decides."""
    if pattern == closer:
        return False if rest.strip() else True if final else None
    if pattern == markup.pad + markup.key_open:
        return True
    # What goes on after a closing tag: the next parameter or the call's end; after a call's end, the next call.
    nexts = [markup.key_open, markup.call_end] if pattern == markup.value_end else [markup.name_open]
    nexts = [text for text in nexts if text]
    goes_on = rest.lstrip()
    if any(goes_on.startswith(text) for text in nexts):
        return True
    if not goes_on:
        return True if final else None
    return None if not final and any(text.startswith(goes_on) for text in nexts) else False


def _value_end(markup: XmlMarkup, text: str, start: int, closer: str, final: bool) -> tuple[int | None, int]:
    """Where the value from `start` ends, and where reading goes on after it; or (None, where the
    text that may still end it begins) while it is open."""
    patterns = _patterns(markup, closer)
    at = start
    while True:
        hits = [(index, pattern) for pattern in patterns if (index := text.find(pattern, at)) >= 0]
        if not hits:
            break
        index, pattern = min(hits)
        verdict = _ends(markup, pattern, text[index + len(pattern) :], closer, final)
        if verdict is None:
            return None, index
        if verdict:
            if pattern == closer:
                return index, len(text)
            if pattern == markup.value_end:
                return index, index + len(pattern)
            return index + len(markup.pad), index + len(markup.pad)
        at = index + 1
    if final:
        return None, len(text)
    # A tail that may yet grow into one of them.
    tail = range(max(start, len(text) - max(map(len, patterns)) + 1), len(text))
    return None, next((i for i in tail if any(pattern.startswith(text[i:]) for pattern in patterns)), len(text))


def _read_call(
    markup: XmlMarkup, text: str, at: int, tools: Sequence[Tool], closer: str, final: bool
) -> tuple[_Call | None, int, bool]:
    """The call from `at` as far as it is written, where reading goes on, and whether the text ends inside one of
    its values. `final`: the text is all there is."""
    if markup.name_open:
        start = text.find(markup.name_open, at)
        if start < 0:
            return None, at, False
        start += len(markup.name_open)
    else:
        start = at + len(text[at:]) - len(text[at:].lstrip())
    ends = [index for index in (text.find(markup.name_end, start), text.find(markup.key_open, start)) if index >= 0]
    # Without an end tag of its own (GLM) a call ends with its section: so may its name.
    stop = min(ends) if ends else len(text) if final and not markup.call_end else -1
    name = text[start:stop].strip() if stop >= 0 else ""
    if not name:
        return None, at, False
    properties = _properties(tools, name) or {}
    shown, at = "{", stop
    while True:
        key_at = text.find(markup.key_open, at)
        closed = text.find(markup.call_end, at) if markup.call_end else -1
        if key_at < 0 or 0 <= closed < key_at:
            whole = closed >= 0 or (final and not markup.call_end)
            resume = closed + len(markup.call_end) if closed >= 0 else len(text)
            return _Call(name, shown + "}" if whole else shown, whole), resume, False
        key_start = key_at + len(markup.key_open)
        key_stop = text.find(markup.key_end, key_start)
        if key_stop < 0:
            return _Call(name, shown, False), len(text), False
        key = text[key_start:key_stop].strip()
        shown += (", " if shown != "{" else "") + json.dumps(key, ensure_ascii=False) + ": "
        value_at = key_stop + len(markup.key_end)
        if markup.value_open:
            value_at = text.find(markup.value_open, value_at)
            if value_at < 0:
                return _Call(name, shown, False), len(text), False
        value_start = value_at + len(markup.value_open)
        value_stop, at = _value_end(markup, text, value_start, closer, final)
        if value_stop is None:
            shown += _shown(markup, text[value_start:at], properties.get(key))
            return _Call(name, shown, False), len(text), True
        value = _convert(_trim(markup, text[value_start:value_stop]), properties.get(key), markup.undeclared_text)
        shown += json.dumps(value, ensure_ascii=False)


def read_calls(
    markup: XmlMarkup, text: str, tools: Sequence[Tool], *, closer: str, final: bool
) -> tuple[list[_Call], bool]:
    """The calls in a section's `text` as far as they are written, and whether it ends inside a value."""
    calls: list[_Call] = []
    at = 0
    while True:
        call, at, inside = _read_call(markup, text, at, tools, closer, final)
        if call is not None:
            calls.append(call)
        if call is None or not call.whole or not markup.call_end:
            return calls, inside


def parse_calls(markup: XmlMarkup, text: str, tools: Sequence[Tool], closer: str) -> list[ParsedCall] | None:
    """The section's whole calls (one cut short at its end is left out), or None if there are none."""
    calls, _ = read_calls(markup, text, tools, closer=closer, final=True)
    parsed = []
    for call in calls:
        arguments = json.loads(call.arguments) if call.whole else None
        if isinstance(arguments, dict):
            parsed.append((call.name, arguments))
    return parsed or None


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
        parts.append(_element(markup, lark_text(INPUT), f"{value} {raw_lark(tool.input_grammar)} {close}", literal))
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


def xml_family(
    name: str,
    markup: XmlMarkup,
    *,
    start: str,
    end: str,
    example: str,
    bare_calls: bool = False,
    reasoning_openers: tuple[str, ...] = (),
) -> Family:
    """A family whose calls are one element per parameter inside `start`…`end`, thinking in `<think>`.

    `bare_calls`: a call may also open with its own `name_open`, the section's opener left out (its
    closer still ends it). `reasoning_openers`: call openers that end a think block left open.
    """

    def text(opener: str, body: str) -> str:
        return opener + body if opener == markup.name_open else body

    def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
        return parse_calls(markup, text(opener, body), tools, end)

    def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
        calls, _ = read_calls(markup, text(opener, body), tools, closer=end, final=False)
        return [CallProgress(call.name, call.arguments) for call in calls]

    def closer_inside(opener: str, body: str) -> bool:
        return read_calls(markup, text(opener, body), (), closer=end, final=True)[1]

    def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
        return forced_calls(markup, tools, marker, start, end)

    return Family(
        name=name,
        parse=parse,
        forced=forced,
        example=example,
        think=("<think>", "</think>"),
        calls=((start, end), *([(markup.name_open, end)] if bare_calls else [])),
        json_bodies=False,
        trigger=start,
        progress=progress,
        closer_inside=closer_inside,
        reasoning_openers=reasoning_openers,
        # Without an end tag of its own, a call is whole only where its section's closer ends it.
        unclosed_calls=bool(markup.call_end),
    )
