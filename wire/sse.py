"""Server-sent event framing: the one place that writes `data:` lines."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring

import attrs

from pipeline.protocol import StreamEvent
from pipeline.requests import JsonValue


def dumps(value: JsonValue) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def frame(data: JsonValue, *, event: str | None = None) -> bytes:
    """One SSE event whose data is `data` as compact JSON."""
    return raw_frame(dumps(data), event=event)


def raw_frame(data: str, *, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {data}\n\n".encode()


def sse(events: Sequence[StreamEvent]) -> bytes:
    """Stream events as SSE: each one's `event:` line, then its data (the bytes `frame` writes)."""
    if len(events) == 1:
        # A streamed token's one event: no join (a tenth of the event's cost on the per-token path).
        name, data = events[0]
        return f"event: {name}\ndata: {data}\n\n".encode()
    return "".join([f"event: {name}\ndata: {data}\n\n" for name, data in events]).encode()


def comment(text: str) -> bytes:
    """A comment frame; clients ignore it, proxies see the stream is alive."""
    return f": {text}\n\n".encode()


@attrs.frozen
class Splice:
    """A frame whose JSON changes from one call to the next in a few values only: strings or integers.

    Serialized once per stream with a marker where each value goes; each
    frame then splices in the values' JSON forms, so per-token work is one
    string escape instead of encoding the whole object. The bytes are those
    `frame` writes.
    """

    # The frame's bytes between the values.
    parts: tuple[bytes, ...]

    @classmethod
    def of(cls, build: Callable[..., JsonValue], *, holes: int = 1, event: str | None = None) -> Splice:
        """`build(marker, ...)` gets one marker string per hole; they must appear once each, in that order."""
        markers = [f"splice-{uuid.uuid4().hex}" for _ in range(holes)]
        parts = _cut(raw_frame(dumps(build(*markers)), event=event).decode(), markers)
        return cls(tuple(part.encode() for part in parts))

    def fill(self, *values: str | int) -> bytes:
        pieces = [self.parts[0]]
        for value, part in zip(values, self.parts[1:], strict=True):
            # encode_basestring is what json.dumps(ensure_ascii=False) uses for a str; an int's JSON is its repr.
            pieces.append(encode_basestring(value).encode() if isinstance(value, str) else repr(int(value)).encode())
            pieces.append(part)
        return b"".join(pieces)


@attrs.frozen
class DataSplice:
    """`Splice` for a stream event's data alone (`StreamEvent.data`): the JSON text, with no SSE framing."""

    parts: tuple[str, ...]

    @classmethod
    def of(cls, build: Callable[..., JsonValue], *, holes: int = 1) -> DataSplice:
        """As `Splice.of`."""
        markers = [f"splice-{uuid.uuid4().hex}" for _ in range(holes)]
        return cls(_cut(dumps(build(*markers)), markers))

    def fill(self, *values: str | int) -> str:
        pieces = [self.parts[0]]
        for value, part in zip(values, self.parts[1:], strict=True):
            pieces.append(encode_basestring(value) if isinstance(value, str) else repr(int(value)))
            pieces.append(part)
        return "".join(pieces)


def _cut(text: str, markers: Sequence[str]) -> tuple[str, ...]:
    """`text` cut at each marker's JSON string.

    Raises:
        ValueError: a marker does not appear exactly once, in order.
    """
    parts = []
    rest = text
    for marker in markers:
        head, found, rest = rest.partition(dumps(marker))
        if not found or marker in head:
            raise ValueError("each marker must appear exactly once in the built frame, in order")
        parts.append(head)
    if any(marker in rest for marker in markers):
        raise ValueError("each marker must appear exactly once in the built frame, in order")
    return (*parts, rest)
