"""wire/anthropic_requests.py: Anthropic Messages JSON → the internal chat request.

One table per endpoint: valid bodies and the exact `ChatRequest` they
decode to. The bad bodies and the 400 each raises (its `param` spelled the
way Anthropic spells it, `messages.0.content.1`) are in
test_anthropic_requests_refused.py.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from pipeline.requests import (
    ChatRequest,
    ClearThinking,
    ClearToolUses,
    Constraint,
    ConstraintKind,
    ContextEdit,
    GenerationParams,
    JsonValue,
    Message,
    Role,
    Sampling,
    Tool,
    ToolCallRecord,
    ToolChoice,
    ToolChoiceMode,
)
from wire.anthropic_requests import decode_count_tokens, decode_messages

UNSUPPORTED = "unsupported_parameter"
USER_HI: dict[str, JsonValue] = {"role": "user", "content": "hi"}
HI = Message(role=Role.USER, content="hi")
SCHEMA: dict[str, JsonValue] = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER: dict[str, JsonValue] = {"name": "get_weather", "description": "Weather now.", "input_schema": SCHEMA}
WEATHER_TOOL = Tool(name="get_weather", description="Weather now.", parameters=SCHEMA)


def body(**fields: JsonValue) -> dict[str, JsonValue]:
    return {"model": "claude-test", "max_tokens": 64, "messages": [USER_HI], **fields}


def chat(
    *messages: Message,
    max_tokens: int = 64,
    stop: tuple[str, ...] = (),
    template_kwargs: dict[str, JsonValue] | None = None,
    tools: tuple[Tool, ...] = (),
    tool_choice: ToolChoice = ToolChoice(),
    constraint: Constraint | None = None,
    continue_final: bool = False,
    parallel_tool_calls: bool = True,
    stream: bool = False,
    context_edits: tuple[ContextEdit, ...] = (),
    omit_reasoning: bool = False,
    **sampling: Any,
) -> ChatRequest:
    return ChatRequest(
        messages=messages or (HI,),
        params=GenerationParams(
            max_tokens=max_tokens,
            sampling=Sampling(**sampling),
            stop=stop,
            constraint=constraint,
            clamp_max_tokens=True,
        ),
        template_kwargs=template_kwargs or {},
        tools=tools,
        tool_choice=tool_choice,
        continue_final=continue_final,
        parallel_tool_calls=parallel_tool_calls,
        stream=stream,
        model="claude-test",
        context_edits=context_edits,
        omit_reasoning=omit_reasoning,
    )


def text(value: str) -> dict[str, JsonValue]:
    return {"type": "text", "text": value}


def tool_result(tool_use_id: str, content: JsonValue = None, **extra: JsonValue) -> dict[str, JsonValue]:
    block: dict[str, JsonValue] = {"type": "tool_result", "tool_use_id": tool_use_id, **extra}
    if content is not None:
        block["content"] = content
    return block


def user(*blocks: JsonValue) -> dict[str, JsonValue]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: JsonValue) -> dict[str, JsonValue]:
    return {"role": "assistant", "content": list(blocks)}


TOOL_USE: dict[str, JsonValue] = {
    "type": "tool_use",
    "id": "toolu_1",
    "name": "get_weather",
    "input": {"city": "Paris"},
}
PARIS_CALL = ToolCallRecord(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}')

VALID_MESSAGES = [
    pytest.param(body(), chat(), id="minimal"),
    pytest.param(
        body(system="Be brief."), chat(Message(role=Role.SYSTEM, content="Be brief."), HI), id="system-string"
    ),
    pytest.param(
        body(system=[text("Be "), {"type": "text", "text": "brief.", "cache_control": {"type": "ephemeral"}}]),
        chat(Message(role=Role.SYSTEM, content="Be brief."), HI),
        id="system-blocks-joined-cache_control-ignored",
    ),
    pytest.param(
        body(messages=[user(text("Hello, "), text("there."))]),
        chat(Message(role=Role.USER, content="Hello, there.")),
        id="user-text-blocks-joined",
    ),
    pytest.param(
        body(messages=[USER_HI, {"role": "user", "content": "again"}]),
        chat(HI, Message(role=Role.USER, content="again")),
        id="consecutive-user-turns-kept-apart",
    ),
    pytest.param(
        body(
            messages=[
                USER_HI,
                assistant(text("Let me check."), TOOL_USE),
                user(
                    text("And tomorrow?"),
                    tool_result("toolu_1", "18C"),
                    tool_result("toolu_2", [text("no "), text("data")], is_error=True),
                ),
            ]
        ),
        chat(
            HI,
            Message(role=Role.ASSISTANT, content="Let me check.", tool_calls=(PARIS_CALL,)),
            Message(role=Role.TOOL, content="18C", tool_call_id="toolu_1"),
            Message(role=Role.TOOL, content="Error: no data", tool_call_id="toolu_2"),
            Message(role=Role.USER, content="And tomorrow?"),
        ),
        id="tool_use-then-tool_results-before-the-users-text",
    ),
    pytest.param(
        body(messages=[USER_HI, assistant(TOOL_USE), user(tool_result("toolu_1"))]),
        chat(
            HI,
            Message(role=Role.ASSISTANT, content="", tool_calls=(PARIS_CALL,)),
            Message(role=Role.TOOL, content="", tool_call_id="toolu_1"),
        ),
        id="tool_result-only-turn-without-content-not-a-prefill",
    ),
    pytest.param(
        body(
            messages=[
                USER_HI,
                assistant(
                    {"type": "tool_use", "id": "toolu_a", "name": "now"},
                    {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {}},
                ),
                user(tool_result("toolu_a", "noon"), tool_result("toolu_b", "rain")),
            ]
        ),
        chat(
            HI,
            Message(
                role=Role.ASSISTANT,
                content="",
                tool_calls=(
                    ToolCallRecord(id="toolu_a", name="now", arguments="{}"),
                    ToolCallRecord(id="toolu_b", name="get_weather", arguments="{}"),
                ),
            ),
            Message(role=Role.TOOL, content="noon", tool_call_id="toolu_a"),
            Message(role=Role.TOOL, content="rain", tool_call_id="toolu_b"),
        ),
        id="two-tool_uses-missing-input-is-empty-object",
    ),
    pytest.param(
        body(
            messages=[
                USER_HI,
                assistant(
                    {"type": "thinking", "thinking": "Greet ", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "thinking", "thinking": "back.", "signature": "sig"},
                    text("Hello!"),
                ),
                {"role": "user", "content": "How are you?"},
            ]
        ),
        chat(
            HI,
            Message(role=Role.ASSISTANT, content="Hello!", reasoning="Greet back."),
            Message(role=Role.USER, content="How are you?"),
        ),
        id="thinking-blocks-become-reasoning-redacted-skipped",
    ),
    pytest.param(
        body(
            messages=[
                USER_HI,
                assistant({"type": "redacted_thinking", "data": "x"}, text("Hi")),
                {"role": "user", "content": "?"},
            ]
        ),
        chat(HI, Message(role=Role.ASSISTANT, content="Hi"), Message(role=Role.USER, content="?")),
        id="only-redacted-thinking-means-no-reasoning",
    ),
    pytest.param(
        body(messages=[USER_HI, {"role": "assistant", "content": "The answer is"}]),
        chat(HI, Message(role=Role.ASSISTANT, content="The answer is"), continue_final=True),
        id="final-assistant-string-is-a-prefill",
    ),
    pytest.param(
        body(messages=[USER_HI, assistant(text("{"))]),
        chat(HI, Message(role=Role.ASSISTANT, content="{"), continue_final=True),
        id="final-assistant-blocks-is-a-prefill",
    ),
    pytest.param(body(stop_sequences=["\n\nHuman:", "END"]), chat(stop=("\n\nHuman:", "END")), id="stop_sequences"),
    pytest.param(body(stop_sequences=[]), chat(), id="stop_sequences-empty"),
    pytest.param(body(temperature=0.2, top_p=0.9, top_k=40), chat(temperature=0.2, top_p=0.9, top_k=40), id="sampling"),
    pytest.param(body(temperature=0, top_p=0, top_k=0), chat(temperature=0.0, top_p=0.0), id="sampling-zeros"),
    pytest.param(body(temperature=1), chat(temperature=1.0), id="temperature-at-maximum"),
    pytest.param(
        body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024}),
        attrs.evolve(
            chat(template_kwargs={"enable_thinking": True}),
            params=attrs.evolve(chat(max_tokens=2048).params, thinking_budget=1024),
        ),
        id="thinking-enabled-with-its-budget",
    ),
    pytest.param(
        body(thinking={"type": "disabled"}), chat(template_kwargs={"enable_thinking": False}), id="thinking-disabled"
    ),
    pytest.param(
        body(thinking={"type": "adaptive"}), chat(template_kwargs={"enable_thinking": True}), id="thinking-adaptive"
    ),
    pytest.param(body(tools=[WEATHER]), chat(tools=(WEATHER_TOOL,)), id="tools"),
    pytest.param(
        body(tools=[{"type": "custom", "name": "now", "input_schema": {"type": "object"}}, {"name": "bare"}]),
        chat(tools=(Tool(name="now", parameters={"type": "object"}), Tool(name="bare"))),
        id="tools-custom-type-no-description-no-schema",
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice={"type": "auto"}), chat(tools=(WEATHER_TOOL,)), id="tool_choice-auto"
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True}),
        chat(tools=(WEATHER_TOOL,), parallel_tool_calls=False),
        id="tool_choice-auto-disable_parallel",
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice={"type": "none"}),
        chat(tools=(WEATHER_TOOL,), tool_choice=ToolChoice(mode=ToolChoiceMode.NONE)),
        id="tool_choice-none",
    ),
    pytest.param(
        body(tool_choice={"type": "none"}),
        chat(tool_choice=ToolChoice(mode=ToolChoiceMode.NONE)),
        id="tool_choice-none-without-tools",
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice={"type": "any"}),
        chat(tools=(WEATHER_TOOL,), tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED)),
        id="tool_choice-any",
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}),
        chat(tools=(WEATHER_TOOL,), tool_choice=ToolChoice(mode=ToolChoiceMode.NAMED, name="get_weather")),
        id="tool_choice-tool",
    ),
    pytest.param(
        body(output_config={"format": {"type": "json_schema", "schema": SCHEMA}}),
        chat(constraint=Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=SCHEMA, param="output_config.format.schema")),
        id="output_config-format-json_schema",
    ),
    pytest.param(
        body(output_config={"effort": "high"}),
        chat(template_kwargs={"reasoning_effort": "high"}),
        id="output_config-effort-sets-the-template-level",
    ),
    pytest.param(
        body(max_tokens=4096, output_config={"effort": "max"}, thinking={"type": "enabled", "budget_tokens": 2000}),
        attrs.evolve(
            chat(template_kwargs={"enable_thinking": True, "reasoning_effort": "high"}),
            params=attrs.evolve(chat(max_tokens=4096).params, thinking_budget=2000),
        ),
        id="output_config-effort-max-with-thinking",
    ),
    pytest.param(body(stream=True), chat(stream=True), id="stream"),
    pytest.param(
        body(
            system=[{"type": "text", "text": "S1", "cache_control": {"type": "ephemeral"}}],
            messages=[
                {"role": "system", "content": "S2"},
                USER_HI,
                {"role": "system", "content": [text("S3")]},
            ],
        ),
        chat(Message(role=Role.SYSTEM, content="S1\n\nS2\n\nS3"), HI),
        id="system-entries-in-messages-fold-into-the-system-prompt-in-order",
    ),
    pytest.param(
        body(max_tokens=32000, thinking={"type": "enabled", "budget_tokens": 31999, "display": "omitted"}),
        attrs.evolve(
            chat(template_kwargs={"enable_thinking": True}, omit_reasoning=True),
            params=attrs.evolve(chat(max_tokens=32000).params, thinking_budget=31999),
        ),
        id="thinking-display-omitted",
    ),
    pytest.param(
        body(context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
        chat(context_edits=(ClearThinking(keep_turns=None),)),
        id="context_management-clear-thinking-keep-all",
    ),
    pytest.param(
        body(context_management={"edits": [{"type": "clear_thinking_20251015"}, {"type": "clear_tool_uses_20250919"}]}),
        chat(context_edits=(ClearThinking(keep_turns=1), ClearToolUses())),
        id="context_management-defaults",
    ),
    pytest.param(
        body(
            context_management={
                "edits": [
                    {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
                    {
                        "type": "clear_tool_uses_20250919",
                        "trigger": {"type": "tool_uses", "value": 4},
                        "keep": {"type": "tool_uses", "value": 1},
                        "clear_at_least": {"type": "input_tokens", "value": 50},
                        "exclude_tools": ["Read"],
                        "clear_tool_inputs": ["Edit"],
                    },
                ]
            }
        ),
        chat(
            context_edits=(
                ClearThinking(keep_turns=2),
                ClearToolUses(
                    trigger_tokens=None,
                    trigger_tool_uses=4,
                    keep=1,
                    clear_at_least=50,
                    exclude_tools=frozenset({"Read"}),
                    clear_inputs=frozenset({"Edit"}),
                ),
            )
        ),
        id="context_management-every-option",
    ),
    pytest.param(
        body(metadata={"user_id": "u1"}, service_tier="auto", container=None, stream=False),
        chat(),
        id="fields-that-cannot-change-the-output-ignored",
    ),
]


@pytest.mark.parametrize(("value", "expected"), VALID_MESSAGES)
def test_decode_messages(value: JsonValue, expected: ChatRequest) -> None:
    """A valid Messages body decodes to exactly the chat request it describes."""
    assert decode_messages(value) == expected


VALID_COUNT_TOKENS = [
    pytest.param({"model": "claude-test", "messages": [USER_HI]}, chat(max_tokens=1), id="no-max_tokens-needed"),
    pytest.param(
        {
            "model": "claude-test",
            "messages": [USER_HI],
            "system": "S",
            "tools": [WEATHER],
            "tool_choice": {"type": "any"},
        },
        chat(
            Message(role=Role.SYSTEM, content="S"),
            HI,
            max_tokens=1,
            tools=(WEATHER_TOOL,),
            tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED),
        ),
        id="system-and-tools-counted",
    ),
]


@pytest.mark.parametrize(("value", "expected"), VALID_COUNT_TOKENS)
def test_decode_count_tokens(value: JsonValue, expected: ChatRequest) -> None:
    """A count_tokens body is a Messages body without `max_tokens`; it decodes the same way."""
    assert decode_count_tokens(value) == expected
