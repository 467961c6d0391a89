"""JSON text from clients (and from the model), read with a nesting bound.

Python's own readers and writers of nested values recurse: `json.loads`,
`json.dumps`, Jinja's `tojson` in chat templates, the tool parsers. A
value nested a few hundred levels deep raises `RecursionError` in one of
them, wherever it happens to be read next. So every JSON text from
outside is read here, once, and one nested past `MAX_DEPTH` is refused as
the request's own fault before anything else walks it.

JSON's `\\uXXXX` escapes can also spell half of a UTF-16 pair alone
(`"a\\ud800b"`): Python reads it into a `str` that is not Unicode text, and
the first encoder downstream (a tokenizer, a template, a log line) fails on
it. Such a string is refused here too, naming where it sits in the value.
"""

from __future__ import annotations

import json
import re

from pipeline.requests import JsonValue

# Real request bodies nest about 5 levels, plus twice a JSON schema's own
# depth; 128 leaves room for deep schemas and stays far below what the
# recursive readers above can take (Python's limit is 1000 frames, and a
# template spends about three per level).
MAX_DEPTH = 128


class LoneSurrogate(ValueError):
    """The text holds a string with half of a UTF-16 surrogate pair alone."""

    def __init__(self, path: str, index: int, code_point: int, in_key: bool) -> None:
        where = f"a key of '{path}'" if in_key and path else "a key" if in_key else f"'{path}'" if path else "the value"
        what = f"a lone surrogate (\\u{code_point:04x} at character {index})"
        super().__init__(f"{where} holds {what}, which is not Unicode text")
        # The field as the APIs name one: `messages[0].content`.
        self.path = path


class TooDeep(ValueError):
    """The text is JSON nested deeper than `MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"JSON nested deeper than {MAX_DEPTH} levels")


def _refuse_constant(name: str) -> None:
    # Python's json reads NaN and Infinity, which JSON does not have.
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def loads(text: str | bytes) -> JsonValue:
    """Decode JSON text, refusing NaN, Infinity and deep nesting.

    Raises:
        TooDeep: the value nests deeper than `MAX_DEPTH`.
        json.JSONDecodeError: the text is not JSON.
        LoneSurrogate: a string (or key) holds a lone UTF-16 surrogate.
        UnicodeDecodeError: bytes that are not UTF-8.
    """
    try:
        value: JsonValue = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise TooDeep() from None
    deepest, surrogates = _walk(value)
    if deepest > MAX_DEPTH:
        raise TooDeep()
    if surrogates:
        raise _first_lone_surrogate(value)
    return value


def depth(value: JsonValue) -> int:
    """How deep containers nest in `value` (a scalar is 0), without recursing."""
    return _walk(value)[0]


def _walk(value: JsonValue) -> tuple[int, bool]:
    """How deep containers nest in `value`, and whether any string in it is not Unicode text."""
    deepest, surrogates, stack = 0, _not_text(value), [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: list[JsonValue] = list(item.values())
            surrogates = surrogates or any(_not_text(key) for key in item)
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, level + 1))
            elif not surrogates:
                surrogates = _not_text(child)
    return deepest, surrogates


def _not_text(value: object) -> bool:
    if not isinstance(value, str) or value.isascii():
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return True
    return False


def _first_lone_surrogate(value: JsonValue) -> LoneSurrogate:
    """The error naming the first string (in document order) that holds a lone surrogate.

    Paths are built only here, on the rare refused body, not on every read.
    """
    stack: list[tuple[JsonValue, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                return LoneSurrogate(path, found.start(), ord(found.group()), in_key=False)
        elif isinstance(item, dict):
            for key in item:
                found = _SURROGATE.search(key)
                if found:
                    return LoneSurrogate(path, found.start(), ord(found.group()), in_key=True)
            stack.extend((child, f"{path}.{key}" if path else key) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{index}]") for index, child in reversed(list(enumerate(item))))
    raise AssertionError("no lone surrogate to name")  # _walk found one


_SURROGATE = re.compile("[\ud800-\udfff]")
