"""The Responses socket's frames: each stream event's data as the HTTP route's SSE carries it, byte for byte, and
errors Codex can read (edge/responses_socket.py)."""

from __future__ import annotations

import itertools
import json
import uuid

import pytest

from edge.responses_socket import SocketEvents, error_frame
from pipeline.errors import ErrorKind, RequestError, shutting_down
from pipeline.events import CompletionEvent, FinishReason, ReasoningDelta, Summary, TextDelta, ToolCall, Usage
from pipeline.protocol import StreamEvent
from tests.wire.responses_expected import stream

# Reasoning, a text that streams in pieces (the spliced per-token data), non-ASCII text, then a tool call.
EVENTS: list[list[CompletionEvent]] = [
    [ReasoningDelta(text="hm")],
    [TextDelta(text="Bon"), TextDelta(text='jour é \u2028 "q"')],
    [TextDelta(text="!")],
    [ToolCall(index=0, id="call_1", name="f", arguments='{"a": 1}')],
]
DONE = Summary(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=3, completion_tokens=5))


def _ids_from_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """Item ids from a fresh counter: two streams of the same events then name their items alike."""
    counter = itertools.count()
    monkeypatch.setattr("wire.responses.uuid.uuid4", lambda: uuid.UUID(int=next(counter)))


def _data_lines(body: bytes) -> list[str]:
    """The `data:` line of each SSE event in `body`, as a client's SSE reader takes it."""
    return [line.removeprefix("data: ") for line in body.decode().split("\n") if line.startswith("data: ")]


def test_each_socket_frame_is_the_data_the_http_route_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    _ids_from_zero(monkeypatch)
    http = stream()
    body = http.start() + b"".join(http.add_events(batch) for batch in EVENTS) + http.finish(DONE)
    _ids_from_zero(monkeypatch)
    socket = SocketEvents(stream())
    events = [*socket.start(), *(event for batch in EVENTS for event in socket.add_events(batch)), *socket.finish(DONE)]
    assert [event.data for event in events] == _data_lines(body)
    # The HTTP body is those same events as SSE, each under its name, nothing else.
    assert body == b"".join(f"event: {event.name}\ndata: {event.data}\n\n".encode() for event in events)
    assert [json.loads(event.data)["type"] for event in events] == [event.name for event in events]
    assert [json.loads(event.data)["sequence_number"] for event in events] == list(range(len(events)))


def test_a_failure_is_the_response_failed_event_and_a_keepalive_sends_nothing() -> None:
    socket = SocketEvents(stream())
    socket.start()
    assert socket.keepalive() == []
    (failed,) = socket.error(shutting_down())
    assert isinstance(failed, StreamEvent) and failed.name == "response.failed"
    assert json.loads(failed.data)["response"]["status"] == "failed"


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
