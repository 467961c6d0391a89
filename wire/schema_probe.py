"""Request schemas read off the decoders themselves, so the description cannot drift from them.

The decoders in `wire/*_requests.py` are the field tables: each reads its
fields by name through `wire.field_reads`, and refuses a wrong value with a 400
whose `param` names the field. The probe runs a decoder on a small valid
body whose objects record every key read (the object's properties), then
puts one value of each JSON type at a field and keeps the types the
decoder does not refuse *for that field*; a field whose removal is refused
by name is required. Arrays of objects are described from their first
item, objects inside objects the same way, to any depth the example has.

What the probe cannot see it leaves open: an enumeration is a `string`,
and a range is only the type. Unknown fields stay allowed, as the
decoders ignore them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.errors import RequestError
from pipeline.requests import JsonObject, JsonValue

Decoder = Callable[[JsonValue], object]
Step = str | int
Path = tuple[Step, ...]

# One value of each JSON type, each unremarkable within its type.
_CANDIDATES: tuple[tuple[str, JsonValue], ...] = (
    ("string", "x"),
    ("integer", 1),
    ("number", 0.5),
    ("boolean", True),
    ("object", {}),
    ("array", []),
    ("null", None),
)
_INDEX = re.compile(r"\[(\d+)\]")


class _Recording(dict[str, Any]):
    """A JSON object that notes each key a decoder looks up."""

    def __init__(self, items: dict[str, Any], path: Path, reads: dict[Path, list[str]]) -> None:
        super().__init__(items)
        self._path, self._reads = path, reads

    def _note(self, key: str) -> None:
        seen = self._reads.setdefault(self._path, [])
        if key not in seen:
            seen.append(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._note(key)
        return super().__contains__(key)


def body_schema(decode: Decoder, example: JsonObject) -> JsonObject:
    """The JSON Schema of the bodies `decode` accepts, probed from `example` (which it must accept).

    Raises:
        ValueError: `decode` refuses `example`.
    """
    reads: dict[Path, list[str]] = {}
    try:
        decode(_recording(example, (), reads))
    except RequestError as error:
        raise ValueError(f"the example body is refused: {error.message}") from None
    return _Probe(decode, example, reads).object_schema(())


def _recording(value: JsonValue, path: Path, reads: dict[Path, list[str]]) -> JsonValue:
    if isinstance(value, dict):
        return _Recording({k: _recording(v, (*path, k), reads) for k, v in value.items()}, path, reads)
    if isinstance(value, list):
        return [_recording(item, (*path, i), reads) for i, item in enumerate(value)]
    return value


class _Probe:
    def __init__(self, decode: Decoder, example: JsonObject, reads: dict[Path, list[str]]) -> None:
        self._decode, self._example, self._reads = decode, example, reads

    def object_schema(self, path: Path) -> JsonObject:
        node = _at(self._example, path)
        assert isinstance(node, dict)
        properties: JsonObject = {}
        required: list[JsonValue] = []
        for key in self._reads.get(path, []):
            properties[key] = self.value_schema((*path, key))
            if key in node and self._refused(_replaced(self._example, (*path, key), _MISSING), (*path, key)):
                required.append(key)
        schema: JsonObject = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        return schema

    def value_schema(self, path: Path) -> JsonObject:
        present = _at(self._example, path)
        types = [name for name, value in _CANDIDATES if not self._refused(_replaced(self._example, path, value), path)]
        if present is not _MISSING:
            types.append(_type_of(present))
        if "number" in types and "integer" in types:
            types.remove("integer")
        order = [name for name, _ in _CANDIDATES]
        names: list[JsonValue] = [name for name in order if name in types]
        schema: JsonObject = {"type": names[0] if len(names) == 1 else names} if names else {"not": {}}
        if isinstance(present, dict) and path in self._reads:
            schema.update({k: v for k, v in self.object_schema(path).items() if k != "type"})
        if isinstance(present, list) and present and isinstance(present[0], dict):
            schema["items"] = self.object_schema((*path, 0))
        return schema

    def _refused(self, body: JsonValue, path: Path) -> bool:
        """Whether the decoder refuses `body` because of the field at `path` (or something inside it)."""
        try:
            self._decode(body)
        except RequestError as error:
            if error.param is None:
                return True
            steps, wanted = _steps(error.param), [str(step) for step in path]
            # Some helpers name a nested field by its key alone (`read_bool(item, "strict")` → "strict").
            return steps[: len(wanted)] == wanted or steps == wanted[-1:]
        return False


class _Missing:
    pass


_MISSING: Any = _Missing()


def _steps(param: str) -> list[str]:
    # OpenAI spells a position `messages[0].content`, Anthropic `messages.0.content`.
    return _INDEX.sub(r".\1", param).split(".")


def _at(value: JsonValue, path: Path) -> Any:
    for step in path:
        if isinstance(value, dict) and isinstance(step, str) and step in value:
            value = value[step]
        elif isinstance(value, list) and isinstance(step, int) and step < len(value):
            value = value[step]
        else:
            return _MISSING
    return value


def _replaced(value: JsonValue, path: Path, new: Any) -> JsonValue:
    """A copy of `value` with the field at `path` set to `new` (removed when `new` is _MISSING)."""
    if not path:
        return new  # type: ignore[no-any-return]
    step, rest = path[0], path[1:]
    if isinstance(value, dict) and isinstance(step, str):
        copy = dict(value)
        inner = _replaced(copy.get(step), rest, new) if rest else new
        if inner is _MISSING:
            copy.pop(step, None)
        else:
            copy[step] = inner
        return copy
    if isinstance(value, list) and isinstance(step, int):
        items = list(value)
        items[step] = _replaced(items[step], rest, new) if rest else new
        return [item for item in items if item is not _MISSING]
    return value


def _type_of(value: JsonValue) -> str:
    for name, kinds in _TYPES:
        if isinstance(value, kinds) and not (name in ("integer", "number") and isinstance(value, bool)):
            return name
    raise TypeError(type(value).__name__)


_TYPES: tuple[tuple[str, type | tuple[type, ...]], ...] = (
    ("string", str),
    ("boolean", bool),
    ("integer", int),
    ("number", float),
    ("object", dict),
    ("array", list),
    ("null", type(None)),
)


def walk(schema: JsonValue) -> Iterator[JsonObject]:
    """Every schema object inside `schema`, itself first (for tests)."""
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from walk(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from walk(item)
