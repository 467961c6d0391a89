"""wire/sse.py: the one place that writes `data:` lines."""

from __future__ import annotations

import pytest

from pipeline.requests import JsonValue
from wire.sse import comment, dumps, frame, raw_frame


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param({"a": 1, "b": [1, 2]}, '{"a":1,"b":[1,2]}', id="compact-separators"),
        pytest.param({"z": 1, "a": 2}, '{"z":1,"a":2}', id="key-order-kept"),
        pytest.param("日本 ☕", '"日本 ☕"', id="non-ascii-raw"),
        pytest.param(None, "null", id="null"),
        pytest.param("line\nbreak", '"line\\nbreak"', id="newline-escaped"),
    ],
)
def test_dumps_is_compact_json(value: JsonValue, expected: str) -> None:
    """JSON is written without spaces and without \\u escapes for non-ASCII text."""
    assert dumps(value) == expected


@pytest.mark.parametrize(
    ("produced", "expected"),
    [
        pytest.param(frame({"x": "é"}), 'data: {"x":"é"}\n\n'.encode(), id="frame"),
        pytest.param(
            frame({"type": "ping"}, event="ping"), b'event: ping\ndata: {"type":"ping"}\n\n', id="frame-with-event"
        ),
        pytest.param(raw_frame("[DONE]"), b"data: [DONE]\n\n", id="raw-done"),
        pytest.param(raw_frame("x", event="e"), b"event: e\ndata: x\n\n", id="raw-with-event"),
        pytest.param(comment("keep-alive"), b": keep-alive\n\n", id="comment"),
    ],
)
def test_frames_are_exact_sse_bytes(produced: bytes, expected: bytes) -> None:
    """Each event is its lines then one blank line, UTF-8 encoded."""
    assert produced == expected


def test_a_newline_in_data_never_splits_the_event() -> None:
    """JSON escapes newlines, so a frame's data is always one `data:` line."""
    produced = frame({"text": "a\n\nb"})
    assert produced.count(b"\n\n") == 1
    assert produced.endswith(b"\n\n")
