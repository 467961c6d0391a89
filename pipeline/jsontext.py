"""JSON text from clients (and from the model), read with a nesting bound.

Python's own readers and writers of nested values recurse: `json.loads`,
`json.dumps`, Jinja's `tojson` in chat templates, the tool parsers. A
value nested a few hundred levels deep raises `RecursionError` in one of
them, wherever it happens to be read next. So every JSON text from
outside is read here, once, and one nested past `MAX_DEPTH` is refused as
the request's own fault before anything else walks it.
"""

from __future__ import annotations

import json

from pipeline.requests import JsonValue

# Real request bodies nest about 5 levels, plus twice a JSON schema's own
# depth; 128 leaves room for deep schemas and stays far below what the
# recursive readers above can take (Python's limit is 1000 frames, and a
# template spends about three per level).
MAX_DEPTH = 128


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
        UnicodeDecodeError: bytes that are not UTF-8.
    """
    try:
        value: JsonValue = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise TooDeep() from None
    if depth(value) > MAX_DEPTH:
        raise TooDeep()
    return value


def depth(value: JsonValue) -> int:
    """How deep containers nest in `value` (a scalar is 0), without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
