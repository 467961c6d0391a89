"""Kimi K3's XTML: elements opened by `<|open|>tag attrs<|sep|>` and closed by `<|close|>tag<|sep|>`.

An assistant message is `<|open|>think<|sep|>…<|close|>think<|sep|>` (thinking mode only), then
`<|open|>response<|sep|>…<|close|>response<|sep|>`, then the calls, then `<|close|>message<|sep|>`:

    <|open|>tools<|sep|><|open|>call tool="name" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>…<|close|>call<|sep|>…
    <|close|>tools<|sep|>

An argument's `type` says how its text reads: `string` as it is, any other (number, boolean, null,
object, array) as JSON. A call may instead carry its arguments as one JSON object,
`<|open|>json type="object"<|sep|>{…}<|close|>json<|sep|>`. Attribute values escape `&` and `"`.

A string's text may hold the text of `<|close|>argument<|sep|>` (the model writes the control tokens
only where an element ends, but decoded text cannot tell the two apart): a value ends at the first one
that the next element or the call's end follows. A string argument streams as it is written, anything
else once its element closes. The think channel's markers are reasoning's, the response channel's and
the message's end are layout (the family and its forced grammar: `kimi_k3.py`). Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import attrs

from pipeline.requests import Tool
from stages.families.base import ParsedCall, in_json_string
from stages.families.jsonscan import scan_value
from stages.families.progress import CallProgress
from stages.stops import partial_suffix

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
# The vocabulary a K3 model has (mlx-lm's `_is_xtml_vocab` reads the same four).
VOCABULARY = (OPEN, CLOSE, SEP, "<|end_of_msg|>")


def opened(tag: str) -> str:
    return f"{OPEN}{tag}{SEP}"


def closed(tag: str) -> str:
    return f"{CLOSE}{tag}{SEP}"


START, END = opened("tools"), closed("tools")
THINK = (opened("think"), closed("think"))
LAYOUT = (opened("response"), closed("response"), closed("message"))
CALL_OPEN, CALL_CLOSE = f"{OPEN}call", closed("call")
ARGUMENT_OPEN, ARGUMENT_CLOSE = f"{OPEN}argument", closed("argument")
JSON_OPEN, JSON_CLOSE = f"{OPEN}json", closed("json")
# What follows an argument's end: the next argument, or the call's end.
_AFTER_ARGUMENT = (ARGUMENT_OPEN, CALL_CLOSE)
_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')


def escape(value: str) -> str:
    """An attribute value as K3 writes it."""
    return value.replace("&", "&amp;").replace('"', "&quot;")


def _attributes(tag: str) -> dict[str, str]:
    return {key: value.replace("&quot;", '"').replace("&amp;", "&") for key, value in _ATTRIBUTE.findall(tag)}


def _decode(text: str, kind: str) -> Any:
    """An argument's value: a string's text as it is, any other type's as JSON (its text where that fails)."""
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


def _undecided(rest: str, followers: Sequence[str]) -> bool:
    """`rest` (whitespace aside) could still become one of `followers`."""
    rest = rest.lstrip()
    return any(follower.startswith(rest) for follower in followers)


def _value_end(body: str, start: int) -> tuple[int | None, int]:
    """Where the value written from `start` ends (None while unknown), and how far it is surely text."""
    at = start
    while (hit := body.find(ARGUMENT_CLOSE, at)) >= 0:
        rest = body[hit + len(ARGUMENT_CLOSE) :].lstrip()
        if rest.startswith(_AFTER_ARGUMENT):
            return hit, hit
        if _undecided(rest, _AFTER_ARGUMENT):
            return None, hit
        at = hit + 1
    # Held back: what could still be the start of an argument's end.
    held = partial_suffix(body, (ARGUMENT_CLOSE,))
    return None, max(start, len(body) - held)


def _tag(body: str, at: int, opener: str) -> tuple[dict[str, str], int] | None:
    """The attributes of the open tag at `at` and where its content starts; None while it is unfinished."""
    end = body.find(SEP, at)
    return None if end < 0 else (_attributes(body[at + len(opener) : end]), end + len(SEP))


@attrs.frozen
class _Read:
    """An element or a call as far as it is written: the arguments' JSON text so far (`shown`), where it ends
    once whole (None while unfinished or broken), and whether the text stops inside one of its values."""

    shown: str
    end: int | None = None
    in_value: bool = False


def _json_block(body: str, at: int) -> _Read:
    """A call's arguments as one JSON object, its canonical text so far."""
    tag = _tag(body, at, JSON_OPEN)
    scan = scan_value(body, tag[1]) if tag is not None else None
    # Arguments are an object: its `{` is sure as soon as the call's head is.
    text = scan.text if scan is not None and scan.text.startswith("{") else "{"
    if scan is None or scan.end is None:
        return _Read(text, in_value=scan is not None and not scan.broken and in_json_string(text))
    rest = body[scan.end :].lstrip()
    whole = rest.startswith(JSON_CLOSE) and scan.text.startswith("{")
    return _Read(text, len(body) - len(rest) + len(JSON_CLOSE) if whole else None)


def _argument(body: str, at: int, shown: str) -> _Read:
    """`shown` with the argument element at `at` as far as it is written: a string's text as it comes,
    any other value once the element closes."""
    tag = _tag(body, at, ARGUMENT_OPEN)
    if tag is None:
        return _Read(shown)
    attributes, start = tag
    if "key" not in attributes:
        return _Read(shown)
    kind = attributes.get("type", "string")
    shown += (", " if shown != "{" else "") + json.dumps(attributes["key"], ensure_ascii=False) + ": "
    end, sure = _value_end(body, start)
    if end is None:
        text = '"' + json.dumps(body[start:sure], ensure_ascii=False)[1:-1] if kind == "string" else ""
        return _Read(shown + text, in_value=True)
    return _Read(shown + json.dumps(_decode(body[start:end], kind), ensure_ascii=False), end + len(ARGUMENT_CLOSE))


def _element(body: str, at: int, read: _Read, whole_object: bool) -> _Read:
    """The next element of a call after `read`, whose text starts at `at`."""
    if body.startswith(ARGUMENT_OPEN, at) and not whole_object:
        return _argument(body, at, read.shown)
    if body.startswith(JSON_OPEN, at) and read.shown == "{":
        return _json_block(body, at)
    return _Read(read.shown)


def _call(body: str, at: int) -> tuple[str | None, _Read]:
    """The name of the call whose open tag is at `at` (None until it is whole) and the call as far as written."""
    tag = _tag(body, at, CALL_OPEN)
    if tag is None or not tag[0].get("tool"):
        return None, _Read("")
    read, whole_object = _Read("{", tag[1]), False
    while read.end is not None:
        at = len(body) - len(body[read.end :].lstrip())
        if body.startswith(CALL_CLOSE, at):
            return tag[0]["tool"], _Read(read.shown if whole_object else read.shown + "}", at + len(CALL_CLOSE))
        whole_object = whole_object or body.startswith(JSON_OPEN, at)
        read = _element(body, at, read, whole_object)
    return tag[0]["tool"], read


def _section(body: str) -> tuple[list[CallProgress], _Read]:
    """The named calls begun in a section, in order, and how the last one read (`end` None unless all are whole)."""
    calls: list[CallProgress] = []
    at, read = body.find(CALL_OPEN), _Read("", 0)
    while at >= 0:
        name, read = _call(body, at)
        if name is not None:
            calls.append(CallProgress(name, read.shown))
        if name is None or read.end is None:
            return calls, attrs.evolve(read, end=None)
        at = body.find(CALL_OPEN, read.end)
    return calls, read


def closer_inside(opener: str, body: str) -> bool:
    """The section's end marker, met after `body`, is text: `body` stops inside an argument's value."""
    return _section(body)[1].in_value


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    """The section's calls, or None unless each is whole."""
    calls, last = _section(body)
    if not calls or last.end is None:
        return None
    parsed = [(call.name, json.loads(call.arguments)) for call in calls]
    if any(name is None or not isinstance(arguments, dict) for name, arguments in parsed):
        return None
    return [(name, arguments) for name, arguments in parsed if name is not None]


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    return _section(body)[0]
