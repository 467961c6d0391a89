"""Keepalives: a stream waiting on a long prefill still sends frames at a fixed interval.

A server with a tiny keepalive interval and a small prefill step takes
many steps over a long prompt, so every API's stream shows its keepalive
frame (an Anthropic `ping` event, an SSE comment for OpenAI and Responses)
before the first token.
"""

from __future__ import annotations

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

PROMPT = "word " * 700


@pytest.fixture(scope="module")
def slow_server(server_factory: ServerFactory) -> Server:
    return server_factory(keepalive_interval="0.01", prefill_step_size="8", prompt_cache_bytes="0")


def lines(server: Server, path: str, body: dict[str, object]) -> list[str]:
    with loopback.stream("POST", f"{server.v1}{path}", json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200, response.read()
        return list(response.iter_lines())


def before_first_data(stream: list[str], data_marker: str) -> list[str]:
    return stream[: next(i for i, line in enumerate(stream) if data_marker in line)]


def test_chat_stream_sends_keepalive_comments_during_prefill(slow_server: Server) -> None:
    stream = lines(
        slow_server,
        "/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2},
    )
    # The role chunk goes first; comments follow while the prompt prefills.
    data = [i for i, line in enumerate(stream) if line.startswith("data: ")]
    assert ": keepalive" in stream[data[0] + 1 : data[1]]


def test_completions_stream_sends_keepalive_comments(slow_server: Server) -> None:
    stream = lines(slow_server, "/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 2})
    assert ": keepalive" in before_first_data(stream, "data: ")


def test_responses_stream_sends_keepalive_comments(slow_server: Server) -> None:
    stream = lines(slow_server, "/responses", {"model": "m", "input": PROMPT, "max_output_tokens": 2, "temperature": 0})
    assert ": keepalive" in before_first_data(stream, "response.output_item.added")


def test_messages_stream_sends_ping_events(slow_server: Server) -> None:
    stream = lines(
        slow_server,
        "/messages",
        {"model": "claude-x", "max_tokens": 2, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0},
    )
    waiting = before_first_data(stream, "content_block_start")
    # One ping follows message_start, as Anthropic sends it; the rest are keepalives.
    assert waiting.count("event: ping") >= 2
