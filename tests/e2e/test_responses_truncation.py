"""Responses' `truncation`: "auto" drops the oldest exchanges of a conversation past the window; "disabled" is a 400.

Through the official `openai` SDK against a real server on the tiny demo model (a 2,048-token window).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import Server

pytestmark = pytest.mark.slow

WINDOW = 2048


def long_conversation(turns: int) -> list[Any]:
    items: list[Any] = []
    for i in range(turns):
        items.append({"role": "user", "content": f"question {i}: " + "tide " * 60})
        items.append({"role": "assistant", "content": f"answer {i}: " + "wave " * 60})
    return [*items, {"role": "user", "content": "and the last question?"}]


def test_auto_drops_the_oldest_exchanges_until_the_input_fits(server: Server) -> None:
    client = server.client()
    response = client.responses.create(
        model="m",
        instructions="Answer briefly.",
        input=long_conversation(20),
        truncation="auto",
        max_output_tokens=8,
        temperature=0,
        store=False,
    )
    assert response.status in ("completed", "incomplete") and response.truncation == "auto"
    assert response.usage is not None and 0 < response.usage.input_tokens <= WINDOW - 8


def test_disabled_is_a_context_400(server: Server) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", input=long_conversation(20), max_output_tokens=8, store=False)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "context_length_exceeded"


def test_auto_continues_a_stored_conversation_past_the_window(server: Server) -> None:
    """A `previous_response_id` chain whose history outgrows the window keeps going under "auto"."""
    client = server.client()
    first = client.responses.create(model="m", input=long_conversation(6), max_output_tokens=8, temperature=0)
    assert first.usage is not None and first.usage.input_tokens < WINDOW
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=long_conversation(6),
        truncation="auto",
        max_output_tokens=8,
        temperature=0,
    )
    assert (
        second.status in ("completed", "incomplete")
        and second.usage is not None
        and second.usage.input_tokens <= WINDOW - 8
    )
