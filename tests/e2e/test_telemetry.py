"""OpenTelemetry traces (the `otel` extra) through a real server and a real OTLP/HTTP receiver."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from tests.conftest import ServerFactory

pytest.importorskip("opentelemetry.sdk", reason="traces are the otel extra: pip install 'mlx-relay[otel]'")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver(BaseHTTPRequestHandler):
    spans: ClassVar[list[Span]] = []

    def do_POST(self) -> None:  # http.server's name for it
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            Receiver.spans.extend(span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.spans = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def spans_of(trace_id: str, count: int) -> list[Span]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [span for span in Receiver.spans if span.trace_id.hex() == trace_id]
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{len(Receiver.spans)} spans arrived, not the {count} of trace {trace_id}")


def test_a_request_is_a_span_with_a_child_per_stage_in_the_callers_trace(
    server_factory: ServerFactory, receiver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    server = server_factory(private=True)  # started under the OTLP environment set above
    client = server.client()
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=3,
        temperature=0,
        extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "x-request-id": "trace-me"},
    )
    spans = spans_of(TRACE_ID, 5)
    (request,) = [span for span in spans if span.name == "POST /v1/chat/completions"]
    assert request.parent_span_id.hex() == PARENT_ID and request.kind == Span.SPAN_KIND_SERVER
    attributes = {a.key: a.value for a in request.attributes}
    assert attributes["mlx_relay.trace_id"].string_value == "trace-me"
    assert attributes["gen_ai.usage.output_tokens"].int_value == 3
    children = sorted(
        (span for span in spans if span.parent_span_id == request.span_id), key=lambda s: s.start_time_unix_nano
    )
    assert [span.name for span in children] == ["prepare", "queue", "prefill", "decode"]
    assert all(
        request.start_time_unix_nano <= c.start_time_unix_nano <= c.end_time_unix_nano <= request.end_time_unix_nano
        for c in children
    )
    # A request without a traceparent starts a trace of its own.
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
    deadline = time.monotonic() + 30
    while not any(s.name.startswith("POST") and s.trace_id.hex() != TRACE_ID for s in Receiver.spans):
        assert time.monotonic() < deadline
        time.sleep(0.1)
