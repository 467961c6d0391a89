"""Calls written as a Python list, `[get_weather(city="Paris"), get_time()]` (Llama 4's pythonic
calls): each call a name with keyword arguments, each argument a Python literal (JSON's
`true`/`false`/`null` read too, as chat templates write nested values in JSON).

`parse_calls` reads a whole list with Python's own parser; `read_calls` reads one as it is written,
its arguments' canonical JSON so far (`jsonscan.py`'s layout): a key once its `=` is written, a string
as its characters come (an escape held back until it is whole), any other value once it ends.
Pure; no I/O.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from typing import Any

from stages.families.base import ParsedCall
from stages.families.progress import CallProgress

_NAME = re.compile(r"[A-Za-z_][\w.]*")
_KEY = re.compile(r"[A-Za-z_]\w*")
_QUOTES = "'\""
_JSON_LITERALS = {"true": True, "false": False, "null": None}
# The longest escape a string may end in unfinished (`\U0001F600`), before it is whole.
_ESCAPE = 10


class _Broken(ValueError):
    """Text that is no Python literal, or one JSON cannot hold (bytes, a set, NaN)."""


class _JsonLiterals(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id not in _JSON_LITERALS:
            return node
        return ast.copy_location(ast.Constant(_JSON_LITERALS[node.id]), node)


def parse_calls(text: str) -> list[ParsedCall] | None:
    """The calls in `text`, a whole Python list of them; None where it is anything else."""
    try:
        tree = _expression(text.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = [_call(node) for node in tree.elts]
    return None if any(call is None for call in calls) else [call for call in calls if call is not None]


def _call(node: ast.expr) -> ParsedCall | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted(node.func)
    if name is None:
        return None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            arguments[keyword.arg] = _json_value(keyword.value)
        except _Broken:
            return None
    return name, arguments


def _expression(text: str) -> ast.expr:
    """`text` read as one Python expression. An unknown escape in a string (`'\\d+'`) stays as written, as Python
    keeps it; its warning is not shown (nor raised where warnings are errors), so every setting reads it alike.

    Raises:
        SyntaxError, ValueError, RecursionError, MemoryError: no expression.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(text, mode="eval").body


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parent = _dotted(node.value)
        return None if parent is None else f"{parent}.{node.attr}"
    return None


def _json_value(node: ast.expr) -> Any:
    """A literal as JSON reads it (a tuple as a list).

    Raises:
        _Broken: not a literal, or no JSON value.
    """
    try:
        value = ast.literal_eval(_JsonLiterals().visit(node))
        return json.loads(json.dumps(value, allow_nan=False))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
        raise _Broken(str(error)) from None


def read_calls(source: str) -> list[CallProgress]:
    """The calls begun in `source`, a Python list of calls as far as it is written."""
    at = _skip(source, 0)
    if not source.startswith("[", at):
        return []
    calls: list[CallProgress] = []
    at += 1
    while True:
        named = _NAME.match(source, _skip(source, at))
        opening = _skip(source, named.end()) if named is not None else len(source)
        if named is None or not source.startswith("(", opening):
            return calls
        arguments, end = _keywords(source, opening + 1)
        calls.append(CallProgress(named.group(), arguments))
        if end is None:
            return calls
        at = _skip(source, end)
        if not source.startswith(",", at):
            return calls
        at += 1


def _keywords(source: str, at: int) -> tuple[str, int | None]:
    """A call's keyword arguments from `at` as canonical JSON so far (no closing brace), and where the
    call ends once its `)` is written."""
    shown = "{"
    while True:
        at = _skip(source, at)
        if source.startswith(")", at):
            return shown, at + 1
        key = _KEY.match(source, at)
        equals = _skip(source, key.end()) if key is not None else len(source)
        if key is None or not source.startswith("=", equals):
            return shown, None
        head = shown + (", " if shown != "{" else "") + json.dumps(key.group(), ensure_ascii=False) + ": "
        end = _value_end(source, equals + 1)
        if end is None:
            started = _string_so_far(source, _skip(source, equals + 1))
            return (shown if started is None else head + started), None
        try:
            value = _json_value(_expression(source[equals + 1 : end].strip()))
        except (_Broken, SyntaxError, ValueError, RecursionError, MemoryError):
            return shown, None
        shown, at = head + json.dumps(value, ensure_ascii=False), end
        if source.startswith(",", at):
            at += 1


def _value_end(source: str, at: int) -> int | None:
    """Where the value from `at` ends: the `,` or `)` after it, outside brackets and strings."""
    depth = 0
    while at < len(source):
        char = source[at]
        if char in _QUOTES:
            after = _string_end(source, at)
            if after is None:
                return None
            at = after
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
        elif char in ",)" and not depth:
            return at
        at += 1
    return None


def _string_end(source: str, at: int) -> int | None:
    """Just past the string literal that opens at `at`; None while it is unfinished."""
    quote = source[at] * 3 if source.startswith(source[at] * 3, at) else source[at]
    at += len(quote)
    while at < len(source):
        if source[at] == "\\":
            at += 2
        elif source.startswith(quote, at):
            return at + len(quote)
        else:
            at += 1
    return None


def _string_so_far(source: str, at: int) -> str | None:
    """An unfinished string value's canonical JSON so far (its closing quote not written), or None
    where the value is not a plain one-quote string, or not yet one."""
    if at >= len(source) or source[at] not in _QUOTES or source.startswith(source[at] * 3, at):
        return None
    end = _string_end(source, at)
    text = source[at + 1 : end - 1] if end is not None else _whole_escapes(source[at + 1 :])
    try:
        value = ast.literal_eval(_expression(source[at] + text + source[at]))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return json.dumps(value, ensure_ascii=False)[:-1] if isinstance(value, str) else None


def _whole_escapes(text: str) -> str:
    """`text` short of an escape that may be unfinished: from its last backslash near the end (and an
    odd one left before that, the first half of an escaped backslash)."""
    escape = text.rfind("\\", max(len(text) - _ESCAPE, 0))
    if escape >= 0:
        text = text[:escape]
    return text[: len(text) - (len(text) - len(text.rstrip("\\"))) % 2]


def _skip(source: str, at: int) -> int:
    while at < len(source) and source[at] in " \t\n\r":
        at += 1
    return at
