"""Server-sent event framing: the one place that writes `data:` lines."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from json.encoder import encode_basestring

import attrs

from pipeline.requests import JsonValue


def dumps(value: JsonValue) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def frame(data: JsonValue, *, event: str | None = None) -> bytes:
    """One SSE event whose data is `data` as compact JSON."""
    return raw_frame(dumps(data), event=event)


def raw_frame(data: str, *, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {data}\n\n".encode()


def comment(text: str) -> bytes:
    """A comment frame; clients ignore it, proxies see the stream is alive."""
    return f": {text}\n\n".encode()


@attrs.frozen
class Splice:
    """A frame whose JSON changes from one call to the next in one string only.

    Serialized once per stream with a marker where the string goes; each
    frame then splices in the string's JSON form, so per-token work is one
    string escape instead of encoding the whole chunk. The bytes are those
    `frame` writes.
    """

    head: bytes
    tail: bytes

    @classmethod
    def of(cls, build: Callable[[str], JsonValue]) -> Splice:
        marker = f"splice-{uuid.uuid4().hex}"
        head, found, tail = frame(build(marker)).partition(dumps(marker).encode())
        if not found or marker.encode() in tail:
            raise ValueError("the marker must appear exactly once in the built frame")
        return cls(head, tail)

    def fill(self, text: str) -> bytes:
        # encode_basestring is what json.dumps(ensure_ascii=False) uses for a str.
        return b"".join((self.head, encode_basestring(text).encode(), self.tail))
