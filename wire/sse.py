"""Server-sent event framing: the one place that writes `data:` lines."""

from __future__ import annotations

import json

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
