"""Anthropic's usage, streamed: message_start already carries the uncached input count and the cache fields,
and they agree with message_delta's and with the body of the same request unstreamed."""

from __future__ import annotations

import pytest

from tests.conftest import Server

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Tell me about the sea. " * 20}]


def test_message_start_reports_the_cache_read_as_message_delta_does(server: Server) -> None:
    claude = server.anthropic_client()
    # The first turn fills the prompt cache; the second reads most of its prompt from it.
    claude.messages.create(model="m", max_tokens=2, messages=PROMPT)  # type: ignore[arg-type]
    with claude.messages.stream(model="m", max_tokens=2, messages=PROMPT) as stream:  # type: ignore[arg-type]
        events = list(stream)
    start = next(event for event in events if event.type == "message_start").message.usage
    delta = next(event for event in events if event.type == "message_delta").usage
    assert start.cache_read_input_tokens and start.cache_read_input_tokens > 100
    assert (start.input_tokens, start.cache_read_input_tokens, start.cache_creation_input_tokens) == (
        delta.input_tokens,
        delta.cache_read_input_tokens,
        delta.cache_creation_input_tokens,
    )
    whole = claude.messages.create(model="m", max_tokens=2, messages=PROMPT).usage  # type: ignore[arg-type]
    assert (whole.input_tokens, whole.cache_read_input_tokens) == (start.input_tokens, start.cache_read_input_tokens)
