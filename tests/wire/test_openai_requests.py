"""wire/openai_requests.py: OpenAI request JSON → the internal request types.

Two tables per endpoint: valid bodies and the exact request they decode to,
and bad bodies and the 400 they raise (its `param` and the gist of its
message). A field that would change the output but is not implemented is
refused by name with code `unsupported_parameter`, never dropped.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError
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
    "type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}
}
WEATHER_TOOL = Tool(name="get_weather", parameters={"type": "object"})

VALID_CHAT = [
    pytest.param(chat_body(), chat(), id="minimal"),
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
        chat_body(reasoning_effort="low"), chat(template_kwargs={"enable_thinking": True}), id="reasoning_effort-low"
    ),
    pytest.param(
        chat_body(reasoning_effort="none"), chat(template_kwargs={"enable_thinking": False}), id="reasoning_effort-none"
    ),
    pytest.param(
        chat_body(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True}),
        chat(template_kwargs={"enable_thinking": True}),
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


def bad(body: JsonValue, param: str | None, gist: str, *, code: str | None = None, id: str) -> Any:
    return pytest.param(body, param, gist, code, id=id)


def unsupported(body: JsonValue, param: str, *, id: str) -> Any:
    return bad(body, param, "not supported", code=UNSUPPORTED, id=id)


def message(**fields: JsonValue) -> dict[str, JsonValue]:
    return chat_body(messages=[fields])


BAD_CHAT = [
    bad([USER_HI], None, "request body must be a JSON object", id="json-array-body"),
    bad("hi", None, "request body must be a JSON object", id="json-string-body"),
    bad(None, None, "request body must be a JSON object", id="json-null-body"),
    bad({"model": "m"}, "messages", "'messages' is required", id="messages-missing"),
    bad(chat_body(messages=None), "messages", "'messages' is required", id="messages-null"),
    bad(chat_body(messages="hi"), "messages", "'messages' must be an array", id="messages-string"),
    bad(chat_body(messages=[]), "messages", "at least one message", id="messages-empty"),
    bad(chat_body(messages=[5]), "messages[0]", "'messages[0]' must be a JSON object", id="message-not-object"),
    bad(
        chat_body(messages=[USER_HI, {"content": "x"}]), "messages[1].role", "'messages[1].role' must be a string",
        id="role-missing",
    ),
    bad(message(role=5, content="x"), "messages[0].role", "must be a string", id="role-not-string"),
    bad(message(role="narrator", content="x"), "messages[0].role", "must be one of", id="role-unknown"),
    bad(message(role="function", content="x"), "messages[0].role", "'function'", id="role-function"),
    bad(message(role="user"), "messages[0].content", "is required", id="user-content-missing"),
    bad(message(role="user", content=None), "messages[0].content", "is required", id="user-content-null"),
    bad(message(role="system", content=None), "messages[0].content", "is required", id="system-content-null"),
    bad(message(role="user", content=5), "messages[0].content", "'messages[0].content'", id="content-number"),
    bad(
        message(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}]),
        "messages[0].content[0].type",
        "'image_url' is not supported",
        id="content-image-part",
    ),
    bad(
        message(role="user", content=["hi"]), "messages[0].content[0]", "must be a JSON object",
        id="content-part-not-object",
    ),
    bad(
        message(role="user", content=[{"type": "text", "text": 5}]),
        "messages[0].content[0].text",
        "must be a string",
        id="content-part-text-not-string",
    ),
    bad(message(role="user", content="x", name=1), "messages[0].name", "must be a string", id="name-not-string"),
    bad(
        message(role="tool", content="x", tool_call_id=1), "messages[0].tool_call_id", "must be a string",
        id="tool_call_id-not-string",
    ),
    bad(
        message(role="assistant", content=None, tool_calls="f"), "messages[0].tool_calls", "must be an array",
        id="tool_calls-not-array",
    ),
    bad(
        message(role="assistant", content=None, tool_calls=[{"id": "c", "type": "function"}]),
        "messages[0].tool_calls[0].function",
        "must be a JSON object",
        id="tool_call-without-function",
    ),
    bad(
        message(role="assistant", content=None, tool_calls=[{"function": {"arguments": "{}"}}]),
        "messages[0].tool_calls[0].function.name",
        "must be a string",
        id="tool_call-without-name",
    ),
    bad(
        message(role="assistant", content="x", reasoning_content=5), "messages[0].reasoning_content",
        "must be a string", id="reasoning_content-not-string",
    ),
    bad(chat_body(max_tokens=-1), "max_tokens", "'max_tokens' must be >= 1, got -1", id="max_tokens-negative"),
    bad(chat_body(max_tokens=0), "max_tokens", "'max_tokens' must be >= 1, got 0", id="max_tokens-zero"),
    bad(chat_body(max_tokens=1.5), "max_tokens", "'max_tokens' must be an integer", id="max_tokens-fraction"),
    bad(chat_body(max_tokens=True), "max_tokens", "'max_tokens' must be an integer", id="max_tokens-bool"),
    bad(chat_body(max_tokens="10"), "max_tokens", "'max_tokens' must be an integer", id="max_tokens-string"),
    bad(
        chat_body(max_completion_tokens=0), "max_completion_tokens", "must be >= 1", id="max_completion_tokens-zero"
    ),
    bad(
        chat_body(max_completion_tokens=False), "max_completion_tokens", "must be an integer",
        id="max_completion_tokens-bool",
    ),
    bad(
        chat_body(max_completion_tokens=5, max_tokens=-1), "max_tokens", "must be >= 1",
        id="max_tokens-checked-even-when-max_completion_tokens-given",
    ),
    bad(chat_body(temperature=-0.1), "temperature", "must be >= 0", id="temperature-negative"),
    bad(chat_body(temperature=2.5), "temperature", "must be <= 2", id="temperature-too-high"),
    bad(chat_body(temperature="hot"), "temperature", "must be a number", id="temperature-string"),
    bad(chat_body(temperature=float("nan")), "temperature", "'temperature'", id="temperature-nan"),
    bad(chat_body(top_p=1.5), "top_p", "must be <= 1", id="top_p-too-high"),
    bad(chat_body(top_p=float("nan")), "top_p", "'top_p'", id="top_p-nan"),
    bad(chat_body(min_p=-1), "min_p", "must be >= 0", id="min_p-negative"),
    bad(chat_body(top_k=-2), "top_k", "must be >= -1", id="top_k-below-minus-one"),
    bad(chat_body(top_k=2.5), "top_k", "must be an integer", id="top_k-fraction"),
    bad(chat_body(seed=1.5), "seed", "must be an integer", id="seed-fraction"),
    bad(chat_body(presence_penalty=3), "presence_penalty", "must be <= 2", id="presence_penalty"),
    bad(chat_body(frequency_penalty=-3), "frequency_penalty", "must be >= -2", id="frequency_penalty"),
    bad(chat_body(repetition_penalty=0), "repetition_penalty", "must be >= 0.01", id="repetition_penalty"),
    bad(chat_body(logit_bias=[]), "logit_bias", "must be a JSON object", id="logit_bias-array"),
    bad(chat_body(logit_bias={"abc": 1}), "logit_bias", "keys must be token ids", id="logit_bias-key-word"),
    bad(chat_body(logit_bias={"-1": 1}), "logit_bias", "keys must be token ids", id="logit_bias-key-negative"),
    bad(chat_body(logit_bias={"5": 101}), "logit_bias", "[-100, 100]", id="logit_bias-value-range"),
    bad(chat_body(logit_bias={"5": True}), "logit_bias", "[-100, 100]", id="logit_bias-value-bool"),
    bad(chat_body(logit_bias={"5": "1"}), "logit_bias", "[-100, 100]", id="logit_bias-value-string"),
    bad(chat_body(stop=""), "stop", "non-empty string", id="stop-empty-string"),
    bad(chat_body(stop=["ok", ""]), "stop", "non-empty string", id="stop-list-with-empty"),
    bad(chat_body(stop=[1]), "stop", "non-empty string", id="stop-list-with-number"),
    bad(chat_body(stop=5), "stop", "'stop' must be an array", id="stop-number"),
    bad(chat_body(stop=[f"s{i}" for i in range(17)]), "stop", "at most 16", id="stop-too-many"),
    bad(chat_body(stream="yes"), "stream", "'stream' must be a boolean", id="stream-string"),
    bad(
        chat_body(stream_options={"include_usage": True}),
        "stream_options",
        "only allowed when 'stream' is true",
        id="stream_options-without-stream",
    ),
    bad(
        chat_body(stream=False, stream_options={"include_usage": True}),
        "stream_options",
        "only allowed when 'stream' is true",
        id="stream_options-with-stream-false",
    ),
    bad(
        chat_body(stream=True, stream_options="usage"), "stream_options", "must be a JSON object",
        id="stream_options-string",
    ),
    bad(
        chat_body(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
        "must be a boolean",
        id="include_usage-string",
    ),
    bad(chat_body(chat_template_kwargs="x"), "chat_template_kwargs", "must be a JSON object", id="template-kwargs"),
    bad(chat_body(n=0), "n", "'n' must be >= 1", id="n-zero"),
    unsupported(chat_body(n=2), "n", id="n-two"),
    bad(chat_body(top_logprobs=2), "top_logprobs", "needs 'logprobs' to be true", id="top_logprobs-without-logprobs"),
    bad(chat_body(logprobs=True, top_logprobs=21), "top_logprobs", "must be <= 20", id="top_logprobs-too-many"),
    bad(chat_body(logprobs=1), "logprobs", "must be a boolean", id="chat-logprobs-integer"),
    bad(chat_body(tools="f"), "tools", "'tools' must be an array", id="tools-not-array"),
    bad(chat_body(tools=[5]), "tools[0]", "must be a JSON object", id="tool-not-object"),
    unsupported(chat_body(tools=[{"type": "code_interpreter"}]), "tools[0].type", id="tool-type-not-function"),
    bad(chat_body(tools=[{"type": "function"}]), "tools[0].function", "must be a JSON object", id="tool-no-function"),
    bad(
        chat_body(tools=[{"type": "function", "function": {"name": ""}}]), "tools[0].function.name",
        "must not be empty", id="tool-empty-name",
    ),
    bad(
        chat_body(tools=[{"type": "function", "function": {"parameters": {}}}]), "tools[0].function.name",
        "must be a string", id="tool-no-name",
    ),
    bad(
        chat_body(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        "tools[0].function.parameters",
        "must be a JSON object",
        id="tool-parameters-not-object",
    ),
    bad(chat_body(tool_choice="required"), "tool_choice", "'tool_choice' needs 'tools'", id="tool_choice-without-tools"),
    bad(
        chat_body(tools=[WEATHER], tool_choice="sometimes"), "tool_choice", "must be 'none', 'auto'",
        id="tool_choice-unknown",
    ),
    bad(
        chat_body(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "f"}}),
        "tool_choice.function.name",
        "'f' is not among the tools",
        id="tool_choice-named-unknown-tool",
    ),
    bad(
        chat_body(tools=[WEATHER], tool_choice={"type": "function"}), "tool_choice.function", "must be a JSON object",
        id="tool_choice-named-without-function",
    ),
    unsupported(chat_body(functions=[{"name": "f"}]), "functions", id="functions"),
    unsupported(chat_body(function_call="auto"), "function_call", id="function_call"),
    bad(chat_body(reasoning_effort="extreme"), "reasoning_effort", "must be one of", id="reasoning_effort-unknown"),
    bad(chat_body(reasoning_effort=5), "reasoning_effort", "must be a string", id="reasoning_effort-not-string"),
    unsupported(chat_body(prediction={"type": "content", "content": "x"}), "prediction", id="prediction"),
    unsupported(chat_body(audio={"voice": "alloy"}), "audio", id="audio"),
    unsupported(chat_body(web_search_options={}), "web_search_options", id="web_search_options"),
    bad(chat_body(response_format="json"), "response_format", "must be a JSON object", id="response_format-string"),
    bad(chat_body(response_format={"type": "xml"}), "response_format.type", "'xml'", id="response_format-unknown-type"),
    bad(
        chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        "response_format.json_schema.schema",
        "Missing required parameter",
        id="response_format-json_schema-without-schema",
    ),
    bad(
        chat_body(response_format={"type": "json_object"}, guided_regex="a+"), "guided_regex",
        "Only one structured-output constraint", id="two-constraints",
    ),
    bad(chat_body(guided_json="{not json"), "guided_json", "is not valid JSON", id="guided_json-bad-text"),
    bad(chat_body(guided_choice=[]), "guided_choice", "non-empty array of strings", id="guided_choice-empty"),
    bad(chat_body(guided_regex=5), "guided_regex", "must be a string", id="guided_regex-not-string"),
    bad(chat_body(structured_outputs={}), "structured_outputs", "exactly one of", id="structured_outputs-empty"),
    unsupported(chat_body(modalities=["text", "audio"]), "modalities", id="modalities-audio"),
    bad(chat_body(modalities="text"), "modalities", "must be an array", id="modalities-string"),
]


@pytest.mark.parametrize(("body", "param", "gist", "code"), BAD_CHAT)
def test_decode_chat_refuses(body: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """A bad chat body is a 400 naming the field; unimplemented fields are refused by name."""
    with pytest.raises(RequestError) as caught:
        decode_chat(body)
    error = caught.value
    assert (error.kind, error.status) == (ErrorKind.INVALID_REQUEST, 400)
    assert error.param == param
    assert gist in error.message
    assert error.code == code


BAD_COMPLETION = [
    bad(["Once"], None, "request body must be a JSON object", id="json-array-body"),
    bad({"model": "m"}, "prompt", "must be a string or a non-empty array", id="prompt-missing"),
    bad(text_body(prompt=5), "prompt", "must be a string or a non-empty array", id="prompt-number"),
    bad(text_body(prompt=[]), "prompt", "must be a string or a non-empty array", id="prompt-empty-list"),
    bad(text_body(prompt=[[]]), "prompt", "must be a string or a non-empty array", id="prompt-empty-ids"),
    bad(text_body(prompt=[True]), "prompt", "must be a string or a non-empty array", id="prompt-bool-id"),
    bad(text_body(prompt=[1.5]), "prompt", "must be a string or a non-empty array", id="prompt-float-id"),
    unsupported(text_body(prompt=["a", "b"]), "prompt", id="prompt-batch-of-strings"),
    unsupported(text_body(prompt=[[1], [2]]), "prompt", id="prompt-batch-of-ids"),
    unsupported(text_body(echo=True), "echo", id="echo"),
    bad(text_body(echo="yes"), "echo", "must be a boolean", id="echo-string"),
    unsupported(text_body(suffix="end"), "suffix", id="suffix"),
    unsupported(text_body(best_of=2), "best_of", id="best_of"),
    bad(text_body(best_of=0), "best_of", "must be >= 1", id="best_of-zero"),
    unsupported(text_body(n=3), "n", id="n"),
    bad(text_body(logprobs=21), "logprobs", "must be <= 20", id="logprobs-too-many"),
    bad(text_body(logprobs=-1), "logprobs", "must be >= 0", id="logprobs-negative"),
    bad(text_body(guided_choice=["a", 1]), "guided_choice", "non-empty array of strings", id="guided_choice-mixed"),
    bad(text_body(max_tokens=0), "max_tokens", "must be >= 1", id="max_tokens-zero"),
    bad(text_body(max_tokens=-5), "max_tokens", "must be >= 1", id="max_tokens-negative"),
    bad(text_body(max_tokens=2.5), "max_tokens", "must be an integer", id="max_tokens-fraction"),
    bad(text_body(max_tokens=False), "max_tokens", "must be an integer", id="max_tokens-bool"),
    bad(text_body(stream_options={"include_usage": True}), "stream_options", "only allowed", id="stream_options"),
    bad(text_body(stop=[""]), "stop", "non-empty string", id="stop-empty"),
]


@pytest.mark.parametrize(("body", "param", "gist", "code"), BAD_COMPLETION)
def test_decode_completion_refuses(body: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """A bad completions body is a 400 naming the field; unimplemented fields are refused by name."""
    with pytest.raises(RequestError) as caught:
        decode_completion(body)
    error = caught.value
    assert (error.kind, error.status) == (ErrorKind.INVALID_REQUEST, 400)
    assert error.param == param
    assert gist in error.message
    assert error.code == code


@pytest.mark.parametrize("decode", [decode_chat, decode_completion], ids=["chat", "completion"])
def test_decoding_leaves_the_body_unchanged(decode: Any) -> None:
    """Decoders are pure: the client's JSON is not mutated."""
    body = {
        "model": "m",
        "messages": [USER_HI],
        "prompt": [1, 2],
        "stop": ["x"],
        "logit_bias": {"3": 1},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    snapshot = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "prompt": [1, 2],
        "stop": ["x"],
        "logit_bias": {"3": 1},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    decode(body)
    assert body == snapshot
