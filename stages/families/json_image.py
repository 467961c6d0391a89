"""A grammar's language as it reads inside a JSON string.

A custom tool's freeform input travels in the family's call markup as
the JSON string `{"input": "…"}`, so constraining it means constraining
the input's *escaped* form. Escaping is a character-by-character map
(`"` → `\\"`, newline → `\\n`, …), and the image of a context-free
language under such a map is context-free: replace every terminal by
its image. `json_string_lark` does that to a Lark grammar (its string
literals and regular expressions) and `json_string_regex` to a regular
expression, giving Lark llguidance compiles; the model writes exactly
what `json.dumps` would, so the input parses back to text the original
grammar accepts. Pure; no I/O.

On error: a grammar this cannot carry into a JSON string (a nested
grammar, a special token, a case-insensitive literal, a regex feature
beyond characters, classes, groups and repeats) is a `ValueError`
naming it; callers answer 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial

# Python's own regex parser: the patterns clients write for Lark and llguidance read the same way in it.
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

# Characters JSON escapes; everything else stands for itself inside a string.
_SPECIALS = tuple(chr(code) for code in range(0x20)) + ('"', "\\")
_SPECIALS_CLASS = r"\x{0}-\x{1F}\x{22}\x{5C}"
# Repeats are spelled out; past this bound a pattern is refused rather than grown without end.
_MAX_BOUND = 64
_LARK_TOKEN = re.compile(
    r"""(?P<comment>//[^\n]*|\#[^\n]*)
      | (?P<range>"(?:\\.|[^"\\])"\s*\.\.\s*"(?:\\.|[^"\\])")
      | (?P<string>"(?:\\.|[^"\\\n])*"(?P<sflags>i?))
      | (?P<regex>/(?:\\.|[^/\\\n])+/(?P<rflags>[imslux]*))
      | (?P<special><[^<>\s]+>)
      | (?P<directive>%[a-z]+)
      | (?P<ref>@[A-Za-z0-9_]+)
      | (?P<other>[^"/<%@\#]+|.)""",
    re.VERBOSE | re.DOTALL,
)
# llguidance's `common` terminals that grammars import.
_COMMON = {
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"(\+|-)?[0-9]+",
    "DECIMAL": r"([0-9]+\.[0-9]*)|(\.[0-9]+)",
    "FLOAT": r"([0-9]+\.[0-9]*|\.[0-9]+)([eE](\+|-)?[0-9]+)?|[0-9]+[eE](\+|-)?[0-9]+",
    "NUMBER": r"([0-9]+)|([0-9]+\.[0-9]*|\.[0-9]+)([eE](\+|-)?[0-9]+)?|[0-9]+[eE](\+|-)?[0-9]+",
    "ESCAPED_STRING": r'"([^"\\]|\\.)*"',
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[A-Za-z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[_A-Za-z][_A-Za-z0-9]*",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "CR": r"\r",
    "LF": r"\n",
    "NEWLINE": r"(\r?\n)+",
}
_IMPORT = re.compile(r"^[ \t]*%import[ \t]+common\.([A-Z_]+)[ \t]*$", re.MULTILINE)
_TERMINAL = re.compile(r"^[ \t]*([A-Z_][A-Z0-9_]*)(?:\.-?\d+)?[ \t]*:", re.MULTILINE)
_IGNORE = re.compile(r"^[ \t]*%ignore[ \t]+([A-Z_][A-Z0-9_]*)", re.MULTILINE)
_IMPORT_MANY = re.compile(r"^[ \t]*%import[ \t]+common[ \t]*\(([^)]*)\)[ \t]*$", re.MULTILINE)


def json_string_lark(grammar: str) -> str:
    """The Lark grammar whose language is `grammar`'s, escaped as inside a JSON string.

    Terminals become rules (`t_<name>`): a terminal is one lexeme, and the
    image of one must be a run of character lexemes (`json_string_regex`).
    A terminal that is `%ignore`d stays one.

    Raises:
        ValueError: the grammar uses what cannot be carried into a JSON string.
    """
    grammar = _IMPORT_MANY.sub(lambda m: "\n".join(_common(name.strip()) for name in m.group(1).split(",")), grammar)
    grammar = _IMPORT.sub(lambda m: _common(m.group(1)), grammar)
    ignored = set(_IGNORE.findall(grammar))
    terminals = set(_TERMINAL.findall(grammar)) - ignored
    rename = re.compile(r"\b(" + "|".join(sorted(terminals)) + r")(?:\.-?\d+)?\b") if terminals else None
    out: list[str] = []
    for match in _LARK_TOKEN.finditer(grammar):
        text = match.group(0)
        if match.group("string") is not None:
            out.append(_string(text))
        elif match.group("regex") is not None:
            body, _, flags = text[1:].rpartition("/")
            out.append(json_string_regex(body.replace("\\/", "/"), flags=flags))
        elif match.group("range") is not None:
            low, high = (json.loads(part.strip()) for part in text.split(".."))
            out.append(json_string_regex(f"[{re.escape(low)}-{re.escape(high)}]"))
        elif match.group("comment") is not None:
            continue
        elif match.group("special") is not None or match.group("ref") is not None:
            raise ValueError(f"{text!r} cannot appear inside a JSON string")
        elif match.group("directive") == "%import":
            raise ValueError("only common terminals can be imported")
        elif match.group("directive") is not None and text not in ("%ignore", "%llguidance"):
            raise ValueError(f"{text} cannot appear inside a JSON string")
        else:
            out.append(rename.sub(lambda m: "t_" + m.group(1).lower(), text) if rename else text)
    return "".join(out)


def _common(name: str) -> str:
    if name not in _COMMON:
        raise ValueError(f"common.{name} is not a terminal this server knows")
    return f"{name}: /{_COMMON[name]}/"


def _string(text: str) -> str:
    if text.endswith("i"):
        raise ValueError("case-insensitive literals cannot be carried inside a JSON string")
    value = json.loads(re.sub(r"\\x([0-9a-fA-F]{2})", r"\\u00\1", text))
    return json.dumps(json.dumps(value, ensure_ascii=False)[1:-1], ensure_ascii=False)


def json_string_regex(pattern: str, *, flags: str = "") -> str:
    """A Lark expression matching `pattern`'s matches, JSON-escaped.

    Each character is a lexeme of its own (a plain one, or its escape as a
    literal): llguidance's lexer looks one byte ahead, and a run of text
    that may go on with `\\"` cannot otherwise end before a `\\n`.

    Raises:
        ValueError: the pattern uses something other than characters, classes, groups and repeats.
    """
    if "i" in flags:
        raise ValueError("case-insensitive patterns cannot be carried inside a JSON string")
    py_flags = (
        (re.DOTALL if "s" in flags else 0) | (re.VERBOSE if "x" in flags else 0) | (re.MULTILINE if "m" in flags else 0)
    )
    try:
        parsed = sre_parse.parse(pattern, py_flags)
    except re.error as error:
        raise ValueError(f"the pattern {pattern[:80]!r} does not parse: {error}") from None
    return _sequence(list(parsed), dotall=bool(parsed.state.flags & re.DOTALL))


def _sequence(items: list[tuple[Any, Any]], *, dotall: bool) -> str:
    parts = [_item(op, av, dotall=dotall) for op, av in items]
    return "(" + " ".join(part for part in parts if part) + ")" if any(parts) else '""'


def _item(op: Any, av: Any, *, dotall: bool) -> str:
    if op is sre.LITERAL:
        return _char(chr(av))
    if op is sre.NOT_LITERAL:
        return _set(lambda c: c != chr(av), rf"[^\x{{{av:X}}}]")
    if op is sre.ANY:
        return _set(lambda c: dotall or c != "\n", r"[\s\S]" if dotall else r"[^\n]")
    if op is sre.IN:
        return _class(av)
    if op is sre.BRANCH:
        return "(" + " | ".join(_sequence(list(branch), dotall=dotall) for branch in av[1]) + ")"
    if op is sre.SUBPATTERN:
        _, add_flags, del_flags, inner = av
        if add_flags or del_flags:
            raise ValueError("inline flags cannot be carried inside a JSON string")
        return _sequence(list(inner), dotall=dotall)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT)):
        return _repeat(av, dotall=dotall)
    if op is sre.AT and av in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING, sre.AT_END, sre.AT_END_STRING):
        # A terminal is matched whole: the anchors say nothing more.
        return ""
    raise ValueError(f"the pattern feature {str(op).lower()} cannot be carried inside a JSON string")


def _repeat(av: tuple[int, Any, Any], *, dotall: bool) -> str:
    low, high, inner = av
    body = _sequence(list(inner), dotall=dotall)
    if high is sre.MAXREPEAT:
        return " ".join([body] * low + [body + "*"])
    if high > _MAX_BOUND:
        raise ValueError(f"a repeat bound of {high} is past what this server expands ({_MAX_BOUND})")
    return " ".join([body] * low + [body + "?"] * (high - low)) or '""'


def _char(char: str) -> str:
    """One character as a literal lexeme: itself, or its JSON escape."""
    return json.dumps(json.dumps(char, ensure_ascii=False)[1:-1], ensure_ascii=False)


_CATEGORIES: dict[Any, tuple[str, Callable[[str], bool]]] = {
    sre.CATEGORY_DIGIT: (r"\d", lambda c: c.isdigit()),
    sre.CATEGORY_NOT_DIGIT: (r"\D", lambda c: not c.isdigit()),
    sre.CATEGORY_SPACE: (r"\s", lambda c: c.isspace()),
    sre.CATEGORY_NOT_SPACE: (r"\S", lambda c: not c.isspace()),
    sre.CATEGORY_WORD: (r"\w", lambda c: c.isalnum() or c == "_"),
    sre.CATEGORY_NOT_WORD: (r"\W", lambda c: not (c.isalnum() or c == "_")),
}


def _class(items: list[tuple[Any, Any]]) -> str:
    negate = bool(items) and items[0][0] is sre.NEGATE
    parts: list[str] = []
    tests: list[Callable[[str], bool]] = []
    for op, av in items[1:] if negate else items:
        if op is sre.LITERAL:
            parts.append(f"\\x{{{av:X}}}")
            tests.append(partial(_in_range, low=av, high=av))
        elif op is sre.RANGE:
            parts.append(f"\\x{{{av[0]:X}}}-\\x{{{av[1]:X}}}")
            tests.append(partial(_in_range, low=av[0], high=av[1]))
        elif op is sre.CATEGORY and av in _CATEGORIES:
            text, test = _CATEGORIES[av]
            parts.append(text)
            tests.append(test)
        else:
            raise ValueError(f"the class item {str(op).lower()} cannot be carried inside a JSON string")
    body = "".join(parts)
    return _set(lambda c: any(test(c) for test in tests) != negate, f"[{'^' if negate else ''}{body}]")


def _in_range(char: str, *, low: int, high: int) -> bool:
    return low <= ord(char) <= high


def _set(member: Callable[[str], bool], rust_class: str) -> str:
    """The image of a character set: one plain member as itself, or a special one's escape."""
    options = [f"/[{rust_class}--[{_SPECIALS_CLASS}]]/"]
    options += [_char(char) for char in _SPECIALS if member(char)]
    return "(" + " | ".join(options) + ")"
