"""Admission limits and graceful shutdown, each on a server of its own."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests import loopback
from tests.conftest import ServerFactory
from tests.e2e.conftest import sse_events

HELLO = [{"role": "user", "content": "hi"}]


def test_full_queue_answers_429_with_retry_after(server_factory: ServerFactory, no_eos: dict[str, int]) -> None:
    server = server_factory(max_batch="1", max_pending="0", admission_timeout="0", retry_after="3")
    body = {"messages": HELLO, "max_tokens": 1900, "stream": True, "logit_bias": no_eos}
    with loopback.stream("POST", f"{server.v1}/chat/completions", json=body, timeout=60) as holder:
        # Keep the generator: dropping it would close the stream, and with it the row.
        held = sse_events(holder)
        next(held)
        refused = loopback.post(
            f"{server.v1}/chat/completions", json={"messages": HELLO, "max_tokens": 2, "temperature": 0}, timeout=30
        )
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "3"
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error" or error["code"] == "rate_limit_exceeded", error
        assert error["message"]
    deadline = time.monotonic() + 10
    while True:
        answer = loopback.post(
            f"{server.v1}/chat/completions", json={"messages": HELLO, "max_tokens": 2, "temperature": 0}, timeout=30
        )
        if answer.status_code == 200:
            break
        assert answer.status_code == 429 and time.monotonic() < deadline
        time.sleep(0.1)
    assert answer.json()["usage"]["completion_tokens"] == 2
    assert loopback.get(f"{server.base_url}/stats", timeout=10).json()["admission"]["refused"] >= 1


def test_shutdown_lets_the_stream_in_flight_finish(server_factory: ServerFactory, no_eos: dict[str, int]) -> None:
    server = server_factory(private=True)  # stopped below
    body = {
        "messages": HELLO,
        "max_tokens": 600,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": no_eos,
    }
    events: list[object] = []
    with loopback.stream("POST", f"{server.v1}/chat/completions", json=body, timeout=120) as response:
        stream = sse_events(response)
        events.append(next(stream))
        events.append(next(stream))
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        time.sleep(0.3)
        # New work is turned away while the stream drains: refused or 503.
        with pytest.raises(httpx.TransportError):
            late = loopback.post(f"{server.v1}/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=5)
            assert late.status_code == 503, late.text
            raise httpx.ConnectError("answered 503")
        events.extend(stream)
    stopper.join(timeout=60)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert isinstance(usage, dict) and usage["usage"]["completion_tokens"] == 600  # type: ignore[index]
    finishes = [e["choices"][0]["finish_reason"] for e in events if isinstance(e, dict) and e["choices"]]  # type: ignore[index]
    assert finishes[-1] == "length"
    assert server.process.wait(timeout=60) == 0
    logs = server.logs()
    assert "server.draining" in logs and "server.stopped" in logs
    # The drained worker leaves without MLX's exit-time destructors, which could abort it (workers/main.py).
    assert "terminate called" not in logs and "Fatal Python error" not in logs
