"""How far the calls in an unfinished call section are written: each
call's name once it is whole, and its arguments' canonical text so far
(`jsonscan.py`), read from the JSON shapes the families write calls in.

A family's `progress` reader takes the same (opener, body, tools) as its
parser, and may be called with the body cut anywhere. Pure; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import attrs

from pipeline.requests import Tool
from stages.families.jsonscan import scan_value


@attrs.frozen
class CallProgress:
    """`name`: None until it is whole; `arguments`: their canonical text so far, "" where
    they cannot stream (arguments written as a JSON string are known only once whole)."""

    name: str | None
    arguments: str = ""


# (opener, body so far, tools) -> the calls begun in the section, in order.
ProgressReader = Callable[[str, str, Sequence[Tool]], list[CallProgress]]
ARGUMENT_KEYS = ("arguments", "parameters")


@attrs.frozen
class _Read:
    calls: list[CallProgress]
    # Where the read ended in the source once whole; None while unfinished or broken.
    end: int | None = None
    broken: bool = False


def _skip(source: str, at: int) -> int:
    while at < len(source) and source[at] in " \t\n\r":
        at += 1
    return at


def object_call(source: str, start: int = 0, keys: Sequence[str] = ARGUMENT_KEYS) -> _Read:
    """`{"name": …, "arguments": {…}}` (members in any order) as far as it is written."""
    at = _skip(source, start)
    if at == len(source):
        return _Read([])
    if source[at] != "{":
        return _Read([], broken=True)
    name: str | None = None
    arguments = ""
    at = _skip(source, at + 1)
    while at < len(source) and source[at] != "}":
        key = scan_value(source, at)
        if key.broken or not key.text.startswith('"'):
            return _Read(_progress(name, arguments), broken=True)
        if key.end is None:
            break
        at = _skip(source, key.end)
        if at == len(source):
            break
        if source[at] != ":":
            return _Read(_progress(name, arguments), broken=True)
        value = scan_value(source, at + 1)
        member = json.loads(key.text)
        if member == "name" and value.end is not None and value.text.startswith('"'):
            name = json.loads(value.text)
        elif member in keys and value.text.startswith("{"):
            arguments = value.text
        if value.broken or value.end is None:
            return _Read(_progress(name, arguments), broken=value.broken)
        at = _skip(source, value.end)
        if at < len(source) and source[at] == ",":
            at = _skip(source, at + 1)
        elif at < len(source) and source[at] != "}":
            return _Read(_progress(name, arguments), broken=True)
    if at >= len(source):
        return _Read(_progress(name, arguments))
    return _Read(_progress(name, arguments), end=at + 1)


def _progress(name: str | None, arguments: str) -> list[CallProgress]:
    return [CallProgress(name, arguments)]


def call_list(source: str, start: int = 0) -> list[CallProgress]:
    """`[{call}, {call}, …]` as far as it is written."""
    at = _skip(source, start)
    if at == len(source) or source[at] != "[":
        return []
    calls: list[CallProgress] = []
    at += 1
    while True:
        read = object_call(source, at)
        calls.extend(read.calls)
        if read.end is None:
            return calls
        at = _skip(source, read.end)
        if at == len(source) or source[at] != ",":
            return calls
        at += 1


def separated_calls(source: str, separator: str = ";") -> list[CallProgress]:
    """`{call}; {call}` (Llama's parallel calls), or one call object."""
    calls: list[CallProgress] = []
    at = 0
    while True:
        read = object_call(source, at)
        calls.extend(read.calls)
        if read.end is None:
            return calls
        at = _skip(source, read.end)
        if at == len(source) or source[at] != separator:
            return calls
        at += 1


def one_object(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    return object_call(body).calls


def object_or_list(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    text = opener + body
    return call_list(text) if text.lstrip().startswith("[") else object_call(text).calls


def named_arguments(name: str, source: str, start: int) -> list[CallProgress]:
    """A call whose name came in the markup, its arguments a JSON object from `start`."""
    if not name.strip():
        return []
    scan = scan_value(source, start)
    return [CallProgress(name.strip(), scan.text if scan.text.startswith("{") else "")]
