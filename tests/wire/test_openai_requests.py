"""wire/openai_requests.py: OpenAI request JSON → the internal request types.

One table per endpoint: valid bodies and the exact request they decode to.
The bad bodies and the 400 each raises are in test_openai_requests_refused.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.requests import (
    ChatRequest,
    Constraint,
    ConstraintKind,
    GenerationParams,
    JsonValue,
    Message,
    Role,
    Sampling,
    TextRequest,
    Tool,
    ToolCallRecord,
    ToolChoice,
    ToolChoiceMode,
)
from wire.openai_requests import decode_chat, decode_completion

UNSUPPORTED = "unsupported_parameter"
USER_HI = {"role": "user", "content": "hi"}


def chat_body(**fields: JsonValue) -> dict[str, JsonValue]:
    return {"model": "m", "messages": [USER_HI], **fields}


def text_body(**fields: JsonValue) -> dict[str, JsonValue]:
    return {"model": "m", "prompt": "Once", **fields}


def chat(
    messages: tuple[Message, ...] = (Message(role=Role.USER, content="hi"),),
    *,
    max_tokens: int | None = None,
    stop: tuple[str, ...] = (),
    template_kwargs: dict[str, JsonValue] | None = None,
    tools: tuple[Tool, ...] = (),
    tool_choice: ToolChoice = ToolChoice(),
    constraint: Constraint | None = None,
    cache_key: str | None = None,
    logprobs: int | None = None,
    stream: bool = False,
    include_usage: bool = False,
    continue_final: bool = False,
    **sampling: Any,
) -> ChatRequest:
    params = GenerationParams(
        max_tokens=max_tokens,
        sampling=Sampling(**sampling),
        stop=stop,
        constraint=constraint,
        cache_key=cache_key,
        logprobs=logprobs,
    )
    return ChatRequest(
        messages=messages,
        params=params,
        template_kwargs=template_kwargs or {},
        tools=tools,
        tool_choice=tool_choice,
        stream=stream,
        include_usage=include_usage,
        continue_final=continue_final,
    )


def text(
    prompt: str | tuple[int, ...] = "Once",
    *,
    max_tokens: int | None = 16,
    stop: tuple[str, ...] = (),
    constraint: Constraint | None = None,
    logprobs: int | None = None,
    stream: bool = False,
    include_usage: bool = False,
    **sampling: Any,
) -> TextRequest:
    params = GenerationParams(
        max_tokens=max_tokens, sampling=Sampling(**sampling), stop=stop, constraint=constraint, logprobs=logprobs
    )
    return TextRequest(
        prompt=prompt,
        params=params,
        stream=stream,
        include_usage=include_usage,
    )


SCHEMA: dict[str, JsonValue] = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
WEATHER: dict[str, JsonValue] = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
WEATHER_TOOL = Tool(name="get_weather", parameters={"type": "object"})

VALID_CHAT = [
    pytest.param(chat_body(), chat(), id="minimal"),
    pytest.param(
        chat_body(
            messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
            continue_final_message=True,
            add_generation_prompt=False,
        ),
        chat((Message(role=Role.USER, content="hi"), Message(role=Role.ASSISTANT, content="Hel")), continue_final=True),
        id="continue_final_message",
    ),
    pytest.param(
        chat_body(min_tokens=0, ignore_eos=False, stop_token_ids=[], typical_p=1.0, skip_special_tokens=True),
        chat(),
        id="extension-fields-at-their-neutral-values",
    ),
    pytest.param(
        chat_body(
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Dev rules."},
                {"role": "user", "content": "Hi", "name": "ann"},
                {"role": "assistant", "content": None},
                {"role": "assistant", "content": "Hello."},
                {"role": "tool", "content": "42", "tool_call_id": "call_1"},
            ]
        ),
        chat(
            (
                Message(role=Role.SYSTEM, content="Be brief."),
                Message(role=Role.DEVELOPER, content="Dev rules."),
                Message(role=Role.USER, content="Hi", name="ann"),
                Message(role=Role.ASSISTANT, content=""),
                Message(role=Role.ASSISTANT, content="Hello."),
                Message(role=Role.TOOL, content="42", tool_call_id="call_1"),
            )
        ),
        id="every-role-name-tool_call_id-null-assistant",
    ),
    pytest.param(
        chat_body(
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hello, "}, {"type": "input_text", "text": "world"}],
                }
            ]
        ),
        chat((Message(role=Role.USER, content="Hello, world"),)),
        id="text-parts-joined",
    ),
    pytest.param(
        chat_body(messages=[{"role": "user", "content": []}]),
        chat((Message(role=Role.USER, content=""),)),
        id="empty-parts-list",
    ),
    pytest.param(
        chat_body(
            temperature=0,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=7,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.1,
            logit_bias={"5": 10, "7": -100},
        ),
        chat(
            temperature=0.0,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=7,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.1,
            logit_bias={5: 10.0, 7: -100.0},
        ),
        id="sampling-params",
    ),
    pytest.param(chat_body(top_k=-1), chat(top_k=0), id="top_k-minus-one-is-off"),
    pytest.param(chat_body(temperature=2), chat(temperature=2.0), id="temperature-at-max"),
    pytest.param(chat_body(seed=-3), chat(seed=-3), id="negative-seed"),
    pytest.param(chat_body(stop="\n"), chat(stop=("\n",)), id="stop-string"),
    pytest.param(chat_body(stop=["END", "###"]), chat(stop=("END", "###")), id="stop-list"),
    pytest.param(chat_body(stop=[]), chat(), id="stop-empty-list"),
    pytest.param(chat_body(stop=None), chat(), id="stop-null"),
    pytest.param(chat_body(max_tokens=12), chat(max_tokens=12), id="max_tokens"),
    pytest.param(chat_body(max_completion_tokens=5), chat(max_tokens=5), id="max_completion_tokens"),
    pytest.param(
        chat_body(max_completion_tokens=5, max_tokens=12), chat(max_tokens=5), id="max_completion_tokens-wins"
    ),
    pytest.param(chat_body(max_tokens=8.0), chat(max_tokens=8), id="max_tokens-integral-float"),
    pytest.param(chat_body(max_tokens=None), chat(), id="max_tokens-null-means-window"),
    pytest.param(chat_body(stream=True), chat(stream=True), id="stream-without-usage"),
    pytest.param(
        chat_body(stream=True, stream_options={"include_usage": True}),
        chat(stream=True, include_usage=True),
        id="stream-include_usage",
    ),
    pytest.param(
        chat_body(stream=True, stream_options={"include_usage": False}), chat(stream=True), id="stream-usage-false"
    ),
    pytest.param(chat_body(stream=True, stream_options={}), chat(stream=True), id="stream-options-empty"),
    pytest.param(chat_body(stream=False), chat(), id="stream-false"),
    pytest.param(
        chat_body(chat_template_kwargs={"enable_thinking": False}),
        chat(template_kwargs={"enable_thinking": False}),
        id="chat_template_kwargs",
    ),
    pytest.param(
        chat_body(
            user="u-1",
            metadata={"k": "v"},
            store=False,
            service_tier="auto",
            parallel_tool_calls=True,
            n=1,
            logprobs=False,
            tools=[],
            response_format={"type": "text"},
            modalities=["text"],
        ),
        chat(),
        id="fields-that-cannot-change-output-ignored",
    ),
    pytest.param(chat_body(tool_choice="auto"), chat(), id="tool_choice-auto"),
    pytest.param(
        chat_body(tool_choice="none"), chat(tool_choice=ToolChoice(mode=ToolChoiceMode.NONE)), id="tool_choice-none"
    ),
    pytest.param(
        chat_body(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object"}},
                },
                {"function": {"name": "ping"}},
            ]
        ),
        chat(
            tools=(
                Tool(name="get_weather", description="Weather now", parameters={"type": "object"}),
                Tool(name="ping"),
            )
        ),
        id="tools",
    ),
    pytest.param(
        chat_body(
            messages=[
                USER_HI,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                        {"type": "function", "function": {"name": "g", "arguments": {"b": 2}}},
                    ],
                },
                {"role": "tool", "content": "ok", "tool_call_id": "c1"},
            ]
        ),
        chat(
            (
                Message(role=Role.USER, content="hi"),
                Message(
                    role=Role.ASSISTANT,
                    content="",
                    tool_calls=(
                        ToolCallRecord(id="c1", name="f", arguments='{"a": 1}'),
                        ToolCallRecord(id="call_1", name="g", arguments='{"b": 2}'),
                    ),
                ),
                Message(role=Role.TOOL, content="ok", tool_call_id="c1"),
            )
        ),
        id="assistant-tool_calls-and-tool-turn",
    ),
    pytest.param(
        chat_body(messages=[USER_HI, {"role": "assistant", "content": "4", "reasoning_content": "2+2"}]),
        chat((Message(role=Role.USER, content="hi"), Message(role=Role.ASSISTANT, content="4", reasoning="2+2"))),
        id="reasoning_content",
    ),
    pytest.param(
        chat_body(messages=[USER_HI, {"role": "assistant", "content": "4", "reasoning": "2+2"}]),
        chat((Message(role=Role.USER, content="hi"), Message(role=Role.ASSISTANT, content="4", reasoning="2+2"))),
        id="reasoning-alias",
    ),
    pytest.param(
        chat_body(tools=[WEATHER], tool_choice="required"),
        chat(tools=(WEATHER_TOOL,), tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED)),
        id="tool_choice-required",
    ),
    pytest.param(
        chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        chat(tools=(WEATHER_TOOL,), tool_choice=ToolChoice(mode=ToolChoiceMode.NAMED, name="get_weather")),
        id="tool_choice-named",
    ),
    pytest.param(
        chat_body(response_format={"type": "json_object"}),
        chat(constraint=Constraint(kind=ConstraintKind.JSON_SCHEMA, spec={"type": "object"}, param="response_format")),
        id="response_format-json_object",
    ),
    pytest.param(
        chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}),
        chat(
            constraint=Constraint(
                kind=ConstraintKind.JSON_SCHEMA, spec=SCHEMA, param="response_format.json_schema.schema"
            )
        ),
        id="response_format-json_schema",
    ),
    pytest.param(
        chat_body(guided_regex="[0-9]+"),
        chat(constraint=Constraint(kind=ConstraintKind.REGEX, spec="[0-9]+", param="guided_regex")),
        id="guided_regex",
    ),
    pytest.param(
        chat_body(guided_choice=["yes", "no"]),
        chat(constraint=Constraint(kind=ConstraintKind.CHOICE, spec=["yes", "no"], param="guided_choice")),
        id="guided_choice",
    ),
    pytest.param(
        chat_body(structured_outputs={"json": SCHEMA}),
        chat(constraint=Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=SCHEMA, param="structured_outputs.json")),
        id="structured_outputs-json",
    ),
    pytest.param(chat_body(logprobs=True), chat(logprobs=0), id="logprobs-chosen-only"),
    pytest.param(chat_body(logprobs=True, top_logprobs=5), chat(logprobs=5), id="top_logprobs"),
    pytest.param(chat_body(logprobs=False), chat(), id="logprobs-false"),
    pytest.param(chat_body(prompt_cache_key="conv-1"), chat(cache_key="conv-1"), id="prompt_cache_key"),
    pytest.param(chat_body(session_id="s-9"), chat(cache_key="s-9"), id="session_id-as-cache-key"),
    pytest.param(
        chat_body(reasoning_effort="low"),
        chat(template_kwargs={"enable_thinking": True, "reasoning_effort": "low"}),
        id="reasoning_effort-low",
    ),
    pytest.param(
        chat_body(reasoning_effort="none"),
        chat(template_kwargs={"enable_thinking": False, "reasoning_effort": "low"}),
        id="reasoning_effort-none",
    ),
    pytest.param(
        chat_body(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}),
        chat(template_kwargs={"enable_thinking": True, "reasoning_effort": "low"}),
        id="explicit-template-kwargs-win-over-reasoning_effort",
    ),
]


@pytest.mark.parametrize(("body", "expected"), VALID_CHAT)
def test_decode_chat(body: JsonValue, expected: ChatRequest) -> None:
    """A valid chat body decodes to exactly the internal request it describes."""
    assert decode_chat(body) == expected


VALID_COMPLETION = [
    pytest.param(text_body(), text(), id="minimal-default-16-tokens"),
    pytest.param(text_body(prompt=["Once"]), text(), id="one-string-in-a-list"),
    pytest.param(text_body(prompt=[1, 2, 3]), text((1, 2, 3)), id="token-ids"),
    pytest.param(text_body(prompt=[[4, 5]]), text((4, 5)), id="token-ids-in-a-list"),
    pytest.param(text_body(prompt=""), text(""), id="empty-string-left-to-prepare"),
    pytest.param(text_body(max_tokens=3), text(max_tokens=3), id="max_tokens"),
    pytest.param(text_body(max_tokens=None), text(), id="max_tokens-null-is-default"),
    pytest.param(text_body(stop=["\n\n"]), text(stop=("\n\n",)), id="stop"),
    pytest.param(text_body(temperature=0, seed=1), text(temperature=0.0, seed=1), id="sampling"),
    pytest.param(
        text_body(stream=True, stream_options={"include_usage": True}),
        text(stream=True, include_usage=True),
        id="stream-include_usage",
    ),
    pytest.param(text_body(echo=False, suffix="", best_of=1, n=1, logprobs=None), text(), id="neutral-values"),
    # Completions' `logprobs` counts alternatives; 0 still asks for the chosen tokens' logprobs.
    pytest.param(text_body(logprobs=0), text(logprobs=0), id="logprobs-zero"),
    pytest.param(text_body(logprobs=3), text(logprobs=3), id="logprobs-three"),
    pytest.param(
        text_body(guided_json='{"type": "object"}'),
        text(constraint=Constraint(kind=ConstraintKind.JSON_SCHEMA, spec={"type": "object"}, param="guided_json")),
        id="guided_json-as-text",
    ),
]


@pytest.mark.parametrize(("body", "expected"), VALID_COMPLETION)
def test_decode_completion(body: JsonValue, expected: TextRequest) -> None:
    """A valid completions body decodes to exactly the internal request it describes."""
    assert decode_completion(body) == expected
