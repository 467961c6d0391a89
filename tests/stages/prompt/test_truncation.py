"""stages/prompt/truncation.py: Responses' `truncation: "auto"` cuts the oldest exchanges until the prompt fits.

Rendered through the tiny demo model's real chat template, as the server renders a Responses turn.
"""

from __future__ import annotations

from functools import partial

import pytest

from pipeline.requests import ChatRequest, GenerationParams, Message, Role, Sampling, ToolCallRecord
from stages.models.loading import Tokenizer
from stages.prompt.chat import render_chat
from stages.prompt.truncation import render_truncated

SYSTEM = Message(role=Role.SYSTEM, content="You are the harbour master's assistant.")


def chat(*messages: Message) -> ChatRequest:
    return ChatRequest(messages=(SYSTEM, *messages), params=GenerationParams(max_tokens=8, sampling=Sampling()))


def talk(turns: int) -> ChatRequest:
    pairs = [
        (
            Message(role=Role.USER, content=f"question {i}: " + "tide " * 30),
            Message(role=Role.ASSISTANT, content=f"answer {i}: " + "wave " * 30),
        )
        for i in range(turns)
    ]
    return chat(*(m for pair in pairs for m in pair), Message(role=Role.USER, content="last question"))


def agent(rounds: int) -> ChatRequest:
    """One task, then many tool rounds: Codex's long turn."""
    messages = [Message(role=Role.USER, content="the task: list the files")]
    for i in range(rounds):
        call = ToolCallRecord(id=f"call_{i}", name="shell", arguments=f'{{"cmd": "ls dir{i}"}}')
        messages += [
            Message(role=Role.ASSISTANT, content="", tool_calls=(call,)),
            Message(role=Role.TOOL, content=f"output {i}: " + "file.txt " * 40, tool_call_id=f"call_{i}"),
        ]
    return chat(*messages)


def test_a_conversation_that_fits_is_rendered_whole(tokenizer: Tokenizer) -> None:
    render = partial(render_chat, tokenizer)
    request = talk(3)
    assert render_truncated(render, request, 10_000) == render(request)


@pytest.mark.parametrize("turns", [6, 25])
def test_the_oldest_exchanges_go_until_it_fits_and_no_more(tokenizer: Tokenizer, turns: int) -> None:
    render = partial(render_chat, tokenizer)
    request = talk(turns)
    room = len(render(request)) // 2
    tokens = render_truncated(render, request, room)
    text = tokenizer.decode(tokens)
    assert len(tokens) <= room
    assert SYSTEM.content in text and "last question" in text and "question 0:" not in text
    # The newest exchange dropped is the one that made it too long: keeping it back would not fit.
    dropped = max(i for i in range(turns) if f"question {i}:" not in text)
    kept_one_more = chat(*talk(turns).messages[1 + 2 * dropped :])
    assert len(render(kept_one_more)) > room


def test_a_long_agent_turn_keeps_its_task_and_never_parts_a_call_from_its_result(tokenizer: Tokenizer) -> None:
    render = partial(render_chat, tokenizer)
    request = agent(12)
    room = len(render(request)) // 2
    tokens = render_truncated(render, request, room)
    text = tokenizer.decode(tokens)
    assert len(tokens) <= room
    assert SYSTEM.content in text and "the task: list the files" in text and "output 11:" in text
    assert "output 0:" not in text and 'ls dir11"' in text
    for i in range(12):
        # A call and its output stay or go together.
        assert (f'ls dir{i}"' in text) == (f"output {i}:" in text), i


def test_a_latest_exchange_too_long_alone_comes_back_alone(tokenizer: Tokenizer) -> None:
    render = partial(render_chat, tokenizer)
    request = chat(
        Message(role=Role.USER, content="old"),
        Message(role=Role.ASSISTANT, content="reply"),
        Message(role=Role.USER, content="long " * 400),
    )
    tokens = render_truncated(render, request, 50)
    text = tokenizer.decode(tokens)
    assert len(tokens) > 50 and "old" not in text and SYSTEM.content in text
