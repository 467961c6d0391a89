"""SIGTERM with streams longer than `--graceful-timeout`: at the deadline every open stream ends with its
API's terminal error event, the rows are aborted, nothing is stored, and the process exits soon after."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import loopback
from tests.conftest import REPO, STARTUP_TIMEOUT, _free_port
from tests.e2e.raw_clients import http1_send, read_until

pytestmark = pytest.mark.slow

GRACE = 3.0
# What the process may take past the graceful timeout: the last words, the engine's stop, the model freed.
EXIT_BOUND = 5.0
HELLO = [{"role": "user", "content": "Tell me something."}]
LONG = 1900
ROUTES = {
    "/v1/chat/completions": {"messages": HELLO, "max_tokens": LONG, "ignore_eos": True},
    "/v1/completions": {"prompt": "Once", "max_tokens": LONG, "ignore_eos": True},
    "/v1/messages": {"messages": HELLO, "max_tokens": LONG},
    "/v1/responses": {"input": "Tell me something.", "max_output_tokens": LONG},
}


@contextlib.contextmanager
def serving(port: int, store: Path) -> Iterator[subprocess.Popen[bytes]]:
    settings = {
        "MLX_RELAY_RESPONSE_STORE": f"sqlite:///{store}",
        "MLX_RELAY_DEMO_MODEL": "tiny",
        "MLX_RELAY_MAX_BATCH": "16",
        "MLX_RELAY_MAX_PENDING": "0",
        "MLX_RELAY_ADMISSION_TIMEOUT": "60",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_")} | settings
    command = [sys.executable, "-m", "mlx_relay", "serve", "--port", str(port), "--graceful-timeout", str(GRACE)]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            assert process.poll() is None, "the server exited at start"
            with contextlib.suppress(httpx.TransportError):
                if loopback.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not become healthy"
            time.sleep(0.2)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class Stream(threading.Thread):
    """One long stream, read to whatever end it gets; `body` is all that came."""

    def __init__(self, base: str, path: str, started: threading.Barrier) -> None:
        super().__init__(daemon=True)
        self.base, self.path, self.started = base, path, started
        self.body = b""
        self.complete = False

    def run(self) -> None:
        body = {"model": "m", "stream": True, **ROUTES[self.path]}
        with loopback.stream("POST", f"{self.base}{self.path}", json=body, timeout=60) as response:
            assert response.status_code == 200
            chunks = response.iter_bytes()
            self.body += next(chunks)
            self.started.wait(timeout=60)
            with contextlib.suppress(httpx.RemoteProtocolError):
                for chunk in chunks:
                    self.body += chunk
                # An unterminated chunked body raises above instead of ending here.
                self.complete = True

    def events(self) -> list[tuple[str, object]]:
        """(event name, JSON data) of each SSE event; the name is "" where the API sends none."""
        found: list[tuple[str, object]] = []
        for block in self.body.decode().split("\n\n"):
            lines = block.strip().splitlines()
            name = next((line.removeprefix("event: ") for line in lines if line.startswith("event: ")), "")
            data = next((line.removeprefix("data: ") for line in lines if line.startswith("data: ")), None)
            if data is not None:
                found.append((name, data if data == "[DONE]" else json.loads(data)))
        return found


def ended_with_its_terminal_error(stream: Stream) -> bool:
    events = stream.events()
    if stream.path in ("/v1/chat/completions", "/v1/completions"):
        return len(events) >= 2 and events[-1][1] == "[DONE]" and _code(events[-2][1]) == "shutting_down"
    name, data = events[-1]
    if stream.path == "/v1/messages":
        return name == "error" and isinstance(data, dict) and data["error"]["type"] == "overloaded_error"
    return name == "response.failed" and isinstance(data, dict) and data["response"]["status"] == "failed"


def finished_on_its_own(stream: Stream) -> bool:
    names = [name for name, _ in stream.events()]
    return "message_stop" in names or "response.completed" in names


def _code(data: object) -> object:
    return data["error"].get("code") if isinstance(data, dict) and isinstance(data.get("error"), dict) else None


def test_streams_past_the_graceful_timeout_get_their_terminal_error_and_the_process_exits(tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    store = tmp_path / "responses.db"
    with serving(port, store) as process:
        started = threading.Barrier(17)
        streams = [Stream(base, path, started) for path in ROUTES for _ in range(4)]
        for stream in streams:
            stream.start()
        started.wait(timeout=60)
        # The batch is full: this one waits for a place, or, admitted, runs past the deadline; not streamed.
        late = http1_send(base, "/v1/chat/completions", {"model": "m", **ROUTES["/v1/chat/completions"]})
        with late:
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            answer = read_until(late, b"}}")
        assert answer.startswith(b"HTTP/1.1 503") and b'"code":"shutting_down"' in answer, answer
        process.wait(timeout=GRACE + EXIT_BOUND + 30)
        exited = time.monotonic() - signalled
        for stream in streams:
            stream.join(timeout=30)
    assert exited < GRACE + EXIT_BOUND, f"the process took {exited:.1f} s to exit"
    assert process.returncode == 0
    for stream in streams:
        assert stream.complete, f"{stream.path}: the body was cut: {stream.body[-300:]!r}"
        assert ended_with_its_terminal_error(stream) or finished_on_its_own(stream), (
            f"{stream.path}: {stream.body[-300:]!r}"
        )
    # Chat and completions ignore EOS, so theirs ran past the deadline for certain.
    assert all(ended_with_its_terminal_error(stream) for stream in streams[:8])
    # A failed Responses turn is never stored; one that finished before the deadline is.
    finished = sum(finished_on_its_own(stream) for stream in streams if stream.path == "/v1/responses")
    with contextlib.closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == finished
