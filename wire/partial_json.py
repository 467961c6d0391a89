"""A call's arguments cut off by max tokens, read as the SDKs' stream helpers read
partial JSON (jiter's partial mode): what is whole is kept, an unfinished string,
literal or key is left out, and open objects and lists are closed. Pure; no I/O."""

from __future__ import annotations

import json
import re
from typing import Any

_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None}
_MISSING = object()


def arguments_object(text: str) -> dict[str, Any]:
    """The arguments as an object: the whole JSON object, or as much of a cut-off one as is whole."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        try:
            value = _value(text, 0)[0]
        except (ValueError, IndexError, RecursionError):
            value = None
    return value if isinstance(value, dict) else {}


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\n\r":
        at += 1
    return at


def _value(text: str, at: int) -> tuple[Any, int, bool]:
    """(value or _MISSING, where it ended, whether it is whole)."""
    at = _skip(text, at)
    if at >= len(text):
        return _MISSING, at, False
    char = text[at]
    if char == "{":
        return _container(text, at + 1, {}, "}")
    if char == "[":
        return _container(text, at + 1, [], "]")
    if char == '"':
        return _string(text, at)
    match = _NUMBER.match(text, at)
    if match is not None and match.end() > at:
        whole = match.end() < len(text)
        return json.loads(match.group()), match.end(), whole
    word = next((word for word in _LITERALS if word.startswith(text[at : at + len(word)])), None)
    if word is None:
        raise ValueError(text[at:])
    whole = text.startswith(word, at)
    return (_LITERALS[word] if whole else _MISSING), at + len(word), whole


def _string(text: str, at: int) -> tuple[Any, int, bool]:
    index = at + 1
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == '"':
            return json.loads(text[at : index + 1]), index + 1, True
        index += 1
    return _MISSING, len(text), False


def _container(text: str, at: int, into: Any, close: str) -> tuple[Any, int, bool]:
    while True:
        at = _skip(text, at)
        if at >= len(text):
            return into, at, False
        if text[at] == close:
            return into, at + 1, True
        key: Any = None
        if close == "}":
            key, at, whole = _string(text, at)
            at = _skip(text, at)
            if not whole or at >= len(text):
                return into, at, False
            at += 1  # the colon
        value, at, whole = _value(text, at)
        if value is not _MISSING:
            if close == "}":
                into[key] = value
            else:
                into.append(value)
        if not whole:
            return into, at, False
        at = _skip(text, at)
        if at < len(text) and text[at] == ",":
            at += 1
