"""stages/prompt/context_edits.py: Anthropic's history edits on the internal conversation.

The prompt size is counted by a stand-in (characters of every message),
so each trigger and threshold is exact; the real template's counts are
covered end to end in tests/e2e/test_agent_sessions.py.
"""

from __future__ import annotations

from pipeline.requests import (
    ChatRequest,
    ClearThinking,
    ClearToolUses,
    ContextEdit,
    GenerationParams,
    Message,
    Role,
    Sampling,
    ToolCallRecord,
)
from stages.prompt.context_edits import CLEARED_RESULT, apply_edits


def size(request: ChatRequest) -> int:
    return sum(
        len(m.content) + len(m.reasoning or "") + sum(len(c.arguments) for c in m.tool_calls) for m in request.messages
    )


def conversation(*edits: ContextEdit) -> ChatRequest:
    """Three assistant turns with reasoning; the last two call tools (Read, Edit, Read)."""
    messages = [
        Message(role=Role.USER, content="q1"),
        Message(role=Role.ASSISTANT, content="a1", reasoning="think-1"),
        Message(role=Role.USER, content="q2"),
        Message(
            role=Role.ASSISTANT,
            content="",
            reasoning="think-2",
            tool_calls=(ToolCallRecord(id="t1", name="Read", arguments='{"f": "a"}'),),
        ),
        Message(role=Role.TOOL, content="R" * 100, tool_call_id="t1"),
        Message(
            role=Role.ASSISTANT,
            content="",
            tool_calls=(ToolCallRecord(id="t2", name="Edit", arguments='{"x": "yyyy"}'),),
        ),
        Message(role=Role.TOOL, content="E" * 100, tool_call_id="t2"),
        Message(role=Role.USER, content="q3"),
        Message(
            role=Role.ASSISTANT,
            content="",
            reasoning="think-3",
            tool_calls=(ToolCallRecord(id="t3", name="Read", arguments='{"f": "b"}'),),
        ),
        Message(role=Role.TOOL, content="S" * 100, tool_call_id="t3"),
    ]
    return ChatRequest(
        messages=tuple(messages), params=GenerationParams(max_tokens=8, sampling=Sampling()), context_edits=edits
    )


def reasoning(request: ChatRequest) -> list[str | None]:
    return [m.reasoning for m in request.messages if m.role is Role.ASSISTANT]


def results(request: ChatRequest) -> list[str]:
    return [m.content for m in request.messages if m.role is Role.TOOL]


def test_clear_thinking_keeps_the_last_turn_by_default() -> None:
    """Turns run from one user message to the next: the second turn spans two assistant messages."""
    edited = apply_edits(conversation(ClearThinking()), size)
    assert reasoning(edited.request) == [None, None, None, "think-3"]
    [applied] = edited.applied
    assert (applied.cleared, applied.cleared_input_tokens) == (2, len("think-1") + len("think-2"))


def test_clear_thinking_keep_all_changes_nothing_and_reports_nothing() -> None:
    edited = apply_edits(conversation(ClearThinking(keep_turns=None)), size)
    assert edited.request == conversation(ClearThinking(keep_turns=None))
    assert edited.applied == ()


def test_clear_tool_uses_clears_the_oldest_results_past_the_trigger() -> None:
    edited = apply_edits(conversation(ClearToolUses(trigger_tokens=100, keep=1)), size)
    assert results(edited.request) == [CLEARED_RESULT, CLEARED_RESULT, "S" * 100]
    [applied] = edited.applied
    assert applied.cleared == 2
    assert applied.cleared_input_tokens == 2 * (100 - len(CLEARED_RESULT))


def test_clear_tool_uses_below_its_trigger_does_nothing() -> None:
    request = conversation(ClearToolUses(trigger_tokens=10_000, keep=0))
    assert apply_edits(request, size).request == request


def test_clear_tool_uses_spares_excluded_tools_and_clears_chosen_inputs() -> None:
    edit = ClearToolUses(
        trigger_tool_uses=2, keep=0, exclude_tools=frozenset({"Read"}), clear_inputs=frozenset({"Edit"})
    )
    edited = apply_edits(conversation(edit), size).request
    assert results(edited) == ["R" * 100, CLEARED_RESULT, "S" * 100]
    calls = {c.name + c.id: c.arguments for m in edited.messages for c in m.tool_calls}
    assert calls == {"Readt1": '{"f": "a"}', "Editt2": "{}", "Readt3": '{"f": "b"}'}


def test_clear_tool_uses_trigger_counts_tool_uses() -> None:
    assert (
        apply_edits(conversation(ClearToolUses(trigger_tokens=None, trigger_tool_uses=3, keep=0)), size).applied == ()
    )
    assert (
        apply_edits(conversation(ClearToolUses(trigger_tokens=None, trigger_tool_uses=2, keep=0)), size).applied != ()
    )


def test_clear_at_least_skips_an_edit_that_would_free_too_little() -> None:
    request = conversation(ClearToolUses(trigger_tokens=0, keep=2, clear_at_least=500))
    edited = apply_edits(request, size)
    assert (edited.request, edited.applied) == (request, ())


def test_edits_run_in_order_each_on_the_last_result() -> None:
    edited = apply_edits(
        conversation(ClearThinking(keep_turns=0), ClearToolUses(trigger_tokens=0, keep=0, clear_inputs=True)), size
    )
    assert [type(a.edit) for a in edited.applied] == [ClearThinking, ClearToolUses]
    assert reasoning(edited.request) == [None, None, None, None]
    assert results(edited.request) == [CLEARED_RESULT] * 3
    assert all(c.arguments == "{}" for m in edited.request.messages for c in m.tool_calls)
