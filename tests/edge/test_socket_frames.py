"""The Responses socket's frames: SSE bytes become `data:` payloads, and errors Codex can read."""

from __future__ import annotations

import json

from edge.responses_socket import data_payloads, error_frame
from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import JsonObject
from wire.sse import comment, frame


def test_each_sse_event_becomes_its_data_payload() -> None:
    first: JsonObject = {"type": "a", "sequence_number": 0}
    second: JsonObject = {"type": "b", "sequence_number": 1}
    chunk = frame(first, event="a") + frame(second, event="b")
    assert [json.loads(p) for p in data_payloads(chunk)] == [
        {"type": "a", "sequence_number": 0},
        {"type": "b", "sequence_number": 1},
    ]


def test_keepalive_comments_carry_no_payload() -> None:
    assert data_payloads(comment("keepalive")) == []


def test_a_payload_on_several_data_lines_is_joined() -> None:
    assert data_payloads(b"event: x\ndata: one\ndata: two\n\n") == ["one\ntwo"]


def test_an_error_frame_has_the_status_and_openais_error_object() -> None:
    error = RequestError(
        kind=ErrorKind.NOT_FOUND, message="gone", param="previous_response_id", code="previous_response_not_found"
    )
    assert json.loads(error_frame(error)) == {
        "type": "error",
        "status": 404,
        "error": {
            "message": "gone",
            "type": "not_found_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        },
    }
