"""Responses' `truncation: "auto"`: a conversation past the window loses its oldest exchanges.

OpenAI drops input items from the beginning of the conversation until the
input fits. Here the instructions (the leading system / developer
messages) always stay, and so does the latest exchange; an exchange starts
at a user message or at an assistant message, so a tool call is never
parted from its results. Where the cut falls after the last user message
before it (a long agent turn: one task, many tool rounds), that message is
kept in front of what remains, so the model still reads its task and the
roles still alternate as templates require. The cut is found by bisection
over the exchanges, a render each (the count falls as the cut moves on).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from pipeline.requests import ChatRequest, Message, Role

_INSTRUCTIONS = (Role.SYSTEM, Role.DEVELOPER)


def render_truncated(render: Callable[[ChatRequest], list[int]], request: ChatRequest, room: int) -> list[int]:
    """The prompt tokens of `request` (`render` makes them), with its oldest exchanges dropped until it fits `room`
    tokens.

    A conversation that fits is rendered whole; one whose latest exchange
    alone does not fit comes back with only that exchange (the preparation
    stage then refuses it as too long).

    Raises:
        RequestError: the template refused the conversation.
    """
    tokens = render(request)
    cuts = _cuts(request.messages)
    if len(tokens) <= room or not cuts:
        return tokens
    # The latest exchange alone: what comes back when nothing fits.
    low, high = 0, len(cuts) - 1
    best = render(_cut(request, cuts[high]))
    if len(best) > room:
        return best
    # Bisection for the earliest cut that fits; `best` is always the render at `high`.
    while low < high:
        middle = (low + high) // 2
        candidate = render(_cut(request, cuts[middle]))
        if len(candidate) <= room:
            high, best = middle, candidate
        else:
            low = middle + 1
    return best


def _head(messages: tuple[Message, ...]) -> int:
    """How many leading messages are instructions."""
    count = 0
    while count < len(messages) and messages[count].role in _INSTRUCTIONS:
        count += 1
    return count


def _cuts(messages: tuple[Message, ...]) -> list[int]:
    """Where the kept part may start: each exchange after the first, oldest first."""
    head = _head(messages)
    starts = [i for i in range(head, len(messages)) if messages[i].role in (Role.USER, Role.ASSISTANT)]
    return starts[1:]


def _cut(request: ChatRequest, start: int) -> ChatRequest:
    messages = request.messages
    head = _head(messages)
    kept = messages[start:]
    if messages[start].role is not Role.USER:
        task = next((m for m in reversed(messages[head:start]) if m.role is Role.USER), None)
        kept = ((task,) if task is not None else ()) + kept
    return attrs.evolve(request, messages=messages[:head] + kept)
