"""Clients that leave: raw HTTP/1.1 sockets and an HTTP/2 (h2c, prior knowledge) connection on the `h2` library.

The SDKs and httpx always read what they asked for; these send a request and then
close the socket or reset the stream at a chosen moment, as a client that gives up does.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import h2.config
import h2.connection
import h2.errors
import h2.events

from tests import loopback
from tests.conftest import Server


def address(server: Server | str) -> tuple[str, int]:
    """Host and port of a server, or of its base URL."""
    base_url = server if isinstance(server, str) else server.base_url
    host, port = base_url.removeprefix("http://").split(":")
    return host, int(port)


def http1_request(server: Server | str, path: str, body: dict[str, object]) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {address(server)[0]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def http1_send(server: Server | str, path: str, body: dict[str, object]) -> socket.socket:
    """A connection that has sent one whole request and reads nothing yet."""
    sock = socket.create_connection(address(server), timeout=30)
    sock.sendall(http1_request(server, path, body))
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    """What the server sent, up to the first `marker` (for example a stream's first content)."""
    seen = b""
    while marker not in seen:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed before sending {marker!r}: {seen[-400:]!r}"
        seen += chunk
    return seen


class H2Client:
    """One h2c connection to the server: streams opened, read and reset at will."""

    def __init__(self, server: Server | str) -> None:
        self._host = address(server)[0]
        self.sock = socket.create_connection(address(server), timeout=30)
        self.conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self._flush()
        self.data: dict[int, bytes] = {}
        self.ended: set[int] = set()
        self.status: dict[int, int] = {}
        self.reset_by_server: dict[int, int] = {}

    def post(self, path: str, body: dict[str, object], *, reset: bool = False, flush: bool = True) -> int:
        """Open a stream with one whole POST; `reset` sends RST_STREAM right behind it."""
        payload = json.dumps(body).encode()
        while self.conn.outbound_flow_control_window < len(payload):
            # The connection's window is spent: the server gives it back as it reads.
            self._flush()
            self._receive(deadline=time.monotonic() + 60.0)
        stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":path", path),
            (":scheme", "http"),
            (":authority", self._host),
            ("content-type", "application/json"),
            ("content-length", str(len(payload))),
        ]
        self.conn.send_headers(stream_id, headers)
        self.conn.send_data(stream_id, payload, end_stream=True)
        if reset:
            self.conn.reset_stream(stream_id, error_code=h2.errors.ErrorCodes.CANCEL)
        if flush:
            self._flush()
        return stream_id

    def reset(self, stream_id: int) -> None:
        self.conn.reset_stream(stream_id, error_code=h2.errors.ErrorCodes.CANCEL)
        self._flush()

    def read_until(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        """Read frames until `done()`; data is acknowledged as it comes, so flow control never stalls the server."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "the h2 server did not send what was awaited"
            self._receive(deadline)

    def _receive(self, deadline: float) -> None:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = self.sock.recv(65536)
        assert chunk, "the h2 server closed the connection"
        for event in self.conn.receive_data(chunk):
            self._on(event)
        self._flush()

    def flush(self) -> None:
        self._flush()

    def close(self) -> None:
        self.conn.close_connection()
        try:
            self._flush()
        finally:
            self.sock.close()

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.status[event.stream_id] = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.DataReceived):
            self.data[event.stream_id] = self.data.get(event.stream_id, b"") + event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
            self.ended.add(event.stream_id)
            if isinstance(event, h2.events.StreamReset):
                self.reset_by_server[event.stream_id] = int(event.error_code)

    def _flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())


def wait_for(
    server: Server, ready: Callable[[dict[str, object]], bool], *, timeout: float, what: str
) -> dict[str, object]:
    """Poll /stats until `ready` holds; fails saying `what` did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        figures: dict[str, object] = loopback.get(f"{server.base_url}/stats", timeout=10).json()
        if ready(figures):
            return figures
        assert time.monotonic() < deadline, f"{what} within {timeout} s: {figures['admission']} {figures['gateway']}"
        time.sleep(0.05)
