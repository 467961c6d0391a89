"""Context edits: history cleared before rendering, as Anthropic's context management does.

The client keeps its whole history and sends it each turn; the server
clears old reasoning and old tool results from what the model sees. The
edits run in the order asked, each on the previous one's result, in the
preparation executor (a trigger in prompt tokens needs a render). What
each edit removed is reported back, in prompt tokens of this model.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from pipeline.requests import AppliedEdit, ChatRequest, ClearThinking, ClearToolUses, ContextEdit, Message, Role

# What the model reads where a tool result was cleared.
CLEARED_RESULT = "[Tool result cleared to save context]"

Count = Callable[[ChatRequest], int]


@attrs.frozen(kw_only=True)
class Edited:
    request: ChatRequest
    applied: tuple[AppliedEdit, ...]


def apply_edits(request: ChatRequest, count: Count) -> Edited:
    """`request` with its context edits applied; `count` gives a request's prompt tokens."""
    applied: list[AppliedEdit] = []
    size = count(request)
    for edit in request.context_edits:
        messages, cleared = _apply(edit, request.messages, size)
        if not cleared:
            continue
        candidate = attrs.evolve(request, messages=messages)
        new_size = count(candidate)
        if isinstance(edit, ClearToolUses) and size - new_size < edit.clear_at_least:
            continue
        applied.append(AppliedEdit(edit=edit, cleared=cleared, cleared_input_tokens=max(0, size - new_size)))
        request, size = candidate, new_size
    return Edited(request=request, applied=tuple(applied))


def _apply(edit: ContextEdit, messages: tuple[Message, ...], size: int) -> tuple[tuple[Message, ...], int]:
    if isinstance(edit, ClearThinking):
        return _clear_thinking(messages, edit.keep_turns)
    return _clear_tool_uses(messages, edit, size)


def _clear_thinking(messages: tuple[Message, ...], keep: int | None) -> tuple[tuple[Message, ...], int]:
    """Reasoning off every assistant turn but the last `keep`; a turn runs from one user message to the next."""
    turns = _assistant_turns(messages)
    if keep is None or len(turns) <= keep:
        return messages, 0
    dropped = turns[: len(turns) - keep]
    cleared = 0
    edited = list(messages)
    for turn in dropped:
        had = False
        for index in turn:
            if edited[index].reasoning:
                edited[index] = attrs.evolve(edited[index], reasoning=None)
                had = True
        cleared += had
    return tuple(edited), cleared


def _assistant_turns(messages: tuple[Message, ...]) -> list[list[int]]:
    turns: list[list[int]] = []
    open_turn = False
    for index, message in enumerate(messages):
        if message.role is Role.USER:
            open_turn = False
        elif message.role is Role.ASSISTANT:
            if not open_turn:
                turns.append([])
                open_turn = True
            turns[-1].append(index)
    return turns


def _clear_tool_uses(messages: tuple[Message, ...], edit: ClearToolUses, size: int) -> tuple[tuple[Message, ...], int]:
    """The oldest tool results (and, if asked, their calls' inputs) cleared, all but the last `keep`."""
    names = {call.id: call.name for message in messages for call in message.tool_calls}
    uses = [call.id for message in messages for call in message.tool_calls]
    if not _triggered(edit, size, len(uses)):
        return messages, 0
    clearable = [use for use in uses[: max(0, len(uses) - edit.keep)] if names[use] not in edit.exclude_tools]
    targets = set(clearable)
    edited: list[Message] = []
    cleared: set[str] = set()
    for message in messages:
        if message.role is Role.TOOL and message.tool_call_id in targets and message.content != CLEARED_RESULT:
            message = attrs.evolve(message, content=CLEARED_RESULT)
            cleared.add(message.tool_call_id or "")
        if message.tool_calls and edit.clear_inputs:
            calls = tuple(
                attrs.evolve(call, arguments="{}")
                if call.id in targets and _clears_input(edit, call.name) and call.arguments != "{}"
                else call
                for call in message.tool_calls
            )
            cleared.update(c.id for c, old in zip(calls, message.tool_calls) if c is not old)
            message = attrs.evolve(message, tool_calls=calls)
        edited.append(message)
    return tuple(edited), len(cleared)


def _triggered(edit: ClearToolUses, size: int, uses: int) -> bool:
    if edit.trigger_tool_uses is not None:
        return uses > edit.trigger_tool_uses
    return edit.trigger_tokens is None or size > edit.trigger_tokens


def _clears_input(edit: ClearToolUses, name: str) -> bool:
    return edit.clear_inputs is True or (isinstance(edit.clear_inputs, frozenset) and name in edit.clear_inputs)
