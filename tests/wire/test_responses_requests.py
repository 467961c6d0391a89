"""wire/responses_requests.py: OpenAI Responses JSON → the validated request, then the chat request.

`decode_responses` is checked as a table of bodies and the exact
`ResponsesRequest` (echo included), and of bad bodies and the 400 each
raises. `to_chat` is checked as a table of input items (with stored
history) and the exact `ChatRequest`. `continued_input` and the stream's
own output items close the loop: what a response produced replays as the
next turn's history.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.events import ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import (
    ChatRequest,
    Constraint,
    ConstraintKind,
    GenerationParams,
    JsonObject,
    JsonValue,
    Message,
    Role,
    Sampling,
    Tool,
    ToolCallRecord,
    ToolChoice,
    ToolChoiceMode,
)
from wire.responses import output_items
from wire.responses_requests import ResponsesRequest, continued_input, decode_responses, to_chat

UNSUPPORTED = "unsupported_parameter"
SCHEMA: dict[str, JsonValue] = {"type": "object", "properties": {"n": {"type": "integer"}}}
WEATHER: dict[str, JsonValue] = {"type": "function", "name": "get_weather", "description": "Now.", "parameters": SCHEMA}
WEATHER_TOOL = Tool(name="get_weather", description="Now.", parameters=SCHEMA)
WEATHER_ECHO: dict[str, JsonValue] = {**WEATHER, "strict": False}
USER_HI_ITEM: JsonObject = {"type": "message", "role": "user", "content": "hi"}
HI = Message(role=Role.USER, content="hi")


def body(**fields: JsonValue) -> dict[str, JsonValue]:
    return {"model": "m", "input": "hi", **fields}


def echo(**fields: JsonValue) -> JsonObject:
    defaults: JsonObject = {
        "max_output_tokens": None,
        "temperature": None,
        "top_p": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "user": None,
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": None, "summary": None},
    }
    return {**defaults, **fields}


def request(
    *items: JsonObject,
    instructions: str | None = None,
    previous_response_id: str | None = None,
    max_tokens: int | None = None,
    constraint: Constraint | None = None,
    tools: tuple[Tool, ...] = (),
    tool_choice: ToolChoice = ToolChoice(),
    template_kwargs: JsonObject | None = None,
    parallel_tool_calls: bool = True,
    store: bool = True,
    stream: bool = False,
    echoed: JsonObject | None = None,
    **sampling: Any,
) -> ResponsesRequest:
    return ResponsesRequest(
        input=items or (USER_HI_ITEM,),
        instructions=instructions,
        previous_response_id=previous_response_id,
        params=GenerationParams(max_tokens=max_tokens, sampling=Sampling(**sampling), constraint=constraint),
        tools=tools,
        tool_choice=tool_choice,
        template_kwargs=template_kwargs or {},
        parallel_tool_calls=parallel_tool_calls,
        store=store,
        stream=stream,
        echo=echoed or echo(),
    )


PARTS_ITEM: JsonObject = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
}

VALID = [
    pytest.param(body(), request(), id="string-input-is-one-user-message"),
    pytest.param(body(input=[PARTS_ITEM]), request(PARTS_ITEM), id="items-kept-as-sent"),
    pytest.param(body(instructions="Be brief."), request(instructions="Be brief."), id="instructions"),
    pytest.param(
        body(previous_response_id="resp_abc-DEF_123"),
        request(previous_response_id="resp_abc-DEF_123"),
        id="previous_response_id",
    ),
    pytest.param(body(store=False), request(store=False), id="store-false"),
    pytest.param(body(store=True), request(), id="store-true"),
    pytest.param(body(store=None), request(), id="store-null-is-default-true"),
    pytest.param(body(stream=True), request(stream=True), id="stream"),
    pytest.param(
        body(max_output_tokens=32, temperature=0.5, top_p=0.9),
        request(
            max_tokens=32, temperature=0.5, top_p=0.9, echoed=echo(max_output_tokens=32, temperature=0.5, top_p=0.9)
        ),
        id="limits-and-sampling-echoed",
    ),
    pytest.param(
        body(temperature=2, top_p=0),
        request(temperature=2.0, top_p=0.0, echoed=echo(temperature=2.0, top_p=0.0)),
        id="sampling-bounds",
    ),
    pytest.param(
        body(metadata={"k": "v"}, parallel_tool_calls=False, truncation="auto", user="u1"),
        request(
            parallel_tool_calls=False,
            echoed=echo(metadata={"k": "v"}, parallel_tool_calls=False, truncation="auto", user="u1"),
        ),
        id="echo-only-fields",
    ),
    pytest.param(
        body(tools=[WEATHER]), request(tools=(WEATHER_TOOL,), echoed=echo(tools=[WEATHER_ECHO])), id="function-tool"
    ),
    pytest.param(
        body(tools=[{"type": "web_search"}, WEATHER, {"type": "file_search", "vector_store_ids": ["vs_1"]}]),
        request(tools=(WEATHER_TOOL,), echoed=echo(tools=[WEATHER_ECHO])),
        id="built-in-tools-dropped",
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice="auto"),
        request(tools=(WEATHER_TOOL,), echoed=echo(tools=[WEATHER_ECHO])),
        id="tool_choice-auto",
    ),
    pytest.param(
        body(tool_choice="none"),
        request(tool_choice=ToolChoice(mode=ToolChoiceMode.NONE), echoed=echo(tool_choice="none")),
        id="tool_choice-none-without-tools",
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice="required"),
        request(
            tools=(WEATHER_TOOL,),
            tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED),
            echoed=echo(tools=[WEATHER_ECHO], tool_choice="required"),
        ),
        id="tool_choice-required",
    ),
    pytest.param(
        body(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}),
        request(
            tools=(WEATHER_TOOL,),
            tool_choice=ToolChoice(mode=ToolChoiceMode.NAMED, name="get_weather"),
            echoed=echo(tools=[WEATHER_ECHO], tool_choice={"type": "function", "name": "get_weather"}),
        ),
        id="tool_choice-function",
    ),
    pytest.param(
        body(reasoning={"effort": "high"}),
        request(template_kwargs={"enable_thinking": True}, echoed=echo(reasoning={"effort": "high", "summary": None})),
        id="effort-high",
    ),
    pytest.param(
        body(reasoning={"effort": "low"}),
        request(template_kwargs={"enable_thinking": True}, echoed=echo(reasoning={"effort": "low", "summary": None})),
        id="effort-low",
    ),
    pytest.param(
        body(reasoning={"effort": "minimal"}),
        request(template_kwargs={"enable_thinking": False}, echoed=echo(reasoning={"effort": "minimal", "summary": None})),
        id="effort-minimal",
    ),
    pytest.param(
        body(reasoning={"effort": "none"}),
        request(template_kwargs={"enable_thinking": False}, echoed=echo(reasoning={"effort": "none", "summary": None})),
        id="effort-none",
    ),
    pytest.param(body(reasoning={"summary": "auto"}), request(), id="reasoning-without-effort"),
    pytest.param(
        body(text={"format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True}}),
        request(
            constraint=Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=SCHEMA, param="text.format.schema"),
            echoed=echo(text={"format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True}}),
        ),
        id="text-format-json_schema",
    ),
    pytest.param(
        body(text={"format": {"type": "json_object"}}),
        request(
            constraint=Constraint(kind=ConstraintKind.JSON_SCHEMA, spec={"type": "object"}, param="text.format"),
            echoed=echo(text={"format": {"type": "json_object"}}),
        ),
        id="text-format-json_object",
    ),
    pytest.param(body(text={"format": {"type": "text"}, "verbosity": "low"}), request(), id="text-format-text"),
    pytest.param(body(background=None, conversation=None, prompt=None), request(), id="refused-fields-null"),
]


@pytest.mark.parametrize(("value", "expected"), VALID)
def test_decode_responses(value: JsonValue, expected: ResponsesRequest) -> None:
    """A valid Responses body decodes to exactly the validated request, and what the response echoes."""
    assert decode_responses(value) == expected


def chat(*messages: Message, **fields: Any) -> ChatRequest:
    return ChatRequest(
        messages=messages,
        params=fields.pop("params", GenerationParams(max_tokens=None, sampling=Sampling())),
        **fields,
    )


def assistant_item(text: str) -> JsonObject:
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(call_id: str, name: str = "get_weather", arguments: JsonValue = '{"n": 1}') -> JsonObject:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def function_output(call_id: str, output: JsonValue) -> JsonObject:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def record(call_id: str, name: str = "get_weather", arguments: str = '{"n": 1}') -> ToolCallRecord:
    return ToolCallRecord(id=call_id, name=name, arguments=arguments)


def items(*values: JsonValue) -> dict[str, JsonValue]:
    return body(input=list(values))


CHATS = [
    pytest.param(body(), (), None, chat(HI), id="string-input"),
    pytest.param(
        items(
            {"role": "system", "content": "S"},
            {"role": "developer", "content": [{"type": "input_text", "text": "D"}]},
            PARTS_ITEM,
            assistant_item("Hi!"),
            {"type": "message", "role": "user", "content": [{"type": "text", "text": "more"}]},
        ),
        (),
        None,
        chat(
            Message(role=Role.SYSTEM, content="S"),
            Message(role=Role.DEVELOPER, content="D"),
            Message(role=Role.USER, content="ab"),
            Message(role=Role.ASSISTANT, content="Hi!"),
            Message(role=Role.USER, content="more"),
        ),
        id="message-items-every-role-and-text-part",
    ),
    pytest.param(
        items(USER_HI_ITEM, assistant_item("Checking."), function_call("call_1"), function_call("call_2", "now", "{}")),
        (),
        None,
        chat(
            HI,
            Message(
                role=Role.ASSISTANT, content="Checking.", tool_calls=(record("call_1"), record("call_2", "now", "{}"))
            ),
        ),
        id="function_calls-join-the-preceding-assistant-message",
    ),
    pytest.param(
        items(USER_HI_ITEM, function_call("call_1"), function_call("call_2")),
        (),
        None,
        chat(HI, Message(role=Role.ASSISTANT, content="", tool_calls=(record("call_1"), record("call_2")))),
        id="function_calls-without-assistant-message-make-one",
    ),
    pytest.param(
        items(
            USER_HI_ITEM,
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
            assistant_item("ok"),
            {"type": "reasoning", "id": "rs_2", "summary": []},
            function_call("call_1", arguments={"n": 2}),
            {"type": "function_call", "call_id": "call_2", "name": "now"},
            function_output("call_1", "42"),
            function_output("call_2", [{"type": "input_text", "text": "no"}, {"type": "input_text", "text": "on"}]),
        ),
        (),
        None,
        chat(
            HI,
            Message(
                role=Role.ASSISTANT,
                content="ok",
                tool_calls=(record("call_1", arguments='{"n": 2}'), record("call_2", "now", "{}")),
            ),
            Message(role=Role.TOOL, content="42", tool_call_id="call_1"),
            Message(role=Role.TOOL, content="noon", tool_call_id="call_2"),
        ),
        id="reasoning-skipped-arguments-object-or-missing-outputs-to-tool-messages",
    ),
    pytest.param(
        items(function_output("call_1", "42"), function_call("call_2")),
        (),
        None,
        chat(
            Message(role=Role.TOOL, content="42", tool_call_id="call_1"),
            Message(role=Role.ASSISTANT, content="", tool_calls=(record("call_2"),)),
        ),
        id="function_call-after-tool-output-is-a-new-turn",
    ),
    pytest.param(
        body(input="Next?", instructions="ignored here"),
        (USER_HI_ITEM, assistant_item("Hello.")),
        "Be brief.",
        chat(
            Message(role=Role.SYSTEM, content="Be brief."),
            HI,
            Message(role=Role.ASSISTANT, content="Hello."),
            Message(role=Role.USER, content="Next?"),
        ),
        id="effective-instructions-lead-history-before-new-input",
    ),
    pytest.param(
        items(function_output("call_1", "42")),
        (USER_HI_ITEM, function_call("call_1")),
        None,
        chat(
            HI,
            Message(role=Role.ASSISTANT, content="", tool_calls=(record("call_1"),)),
            Message(role=Role.TOOL, content="42", tool_call_id="call_1"),
        ),
        id="tool-output-answers-a-stored-call",
    ),
    pytest.param(body(), (), "", chat(HI), id="empty-instructions-add-no-message"),
    pytest.param(
        body(
            max_output_tokens=8,
            temperature=0.0,
            stream=True,
            tools=[WEATHER],
            tool_choice="required",
            reasoning={"effort": "high"},
        ),
        (),
        None,
        chat(
            HI,
            params=GenerationParams(max_tokens=8, sampling=Sampling(temperature=0.0)),
            template_kwargs={"enable_thinking": True},
            tools=(WEATHER_TOOL,),
            tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED),
            stream=True,
        ),
        id="params-tools-and-template-kwargs-carried",
    ),
]


@pytest.mark.parametrize(("value", "history", "instructions", "expected"), CHATS)
def test_to_chat(
    value: JsonValue, history: tuple[JsonObject, ...], instructions: str | None, expected: ChatRequest
) -> None:
    """The chat request is the instructions, then the stored history, then the new input, as messages."""
    assert to_chat(decode_responses(value), history, instructions) == expected


def test_continued_input_is_stored_input_then_output() -> None:
    """A follow-up replays the stored input, then the stored output items; non-objects are skipped."""
    stored_input: list[JsonValue] = [USER_HI_ITEM]
    stored_output: list[JsonValue] = [assistant_item("a"), "junk", function_call("call_1")]
    assert continued_input(stored_input, stored_output) == (USER_HI_ITEM, assistant_item("a"), function_call("call_1"))
    assert continued_input([], []) == ()


def test_a_responses_output_replays_as_the_assistant_turn() -> None:
    """The output items the stream builds decode back to the turn that produced them."""
    output: list[JsonValue] = list(
        output_items(
            [
                ReasoningDelta(text="think"),
                TextDelta(text="Let me "),
                TextDelta(text="look."),
                ToolCall(index=0, id="call_1", name="get_weather", arguments='{"n": 1}'),
            ]
        )
    )
    history = continued_input([USER_HI_ITEM], output)
    follow_up = decode_responses(items(function_output("call_1", "7")))
    assert to_chat(follow_up, history, None).messages == (
        HI,
        Message(role=Role.ASSISTANT, content="Let me look.", tool_calls=(record("call_1"),)),
        Message(role=Role.TOOL, content="7", tool_call_id="call_1"),
    )


def bad(value: JsonValue, param: str | None, gist: str, *, code: str | None = None, id: str) -> Any:
    return pytest.param(value, param, gist, code, id=id)


def refused(value: JsonValue, param: str, *, id: str) -> Any:
    return bad(value, param, "not supported", code=UNSUPPORTED, id=id)


IMAGE_PART: JsonObject = {"type": "input_image", "image_url": "https://example.com/a.png"}

BAD = [
    bad([USER_HI_ITEM], None, "must be a JSON object", id="body-array"),
    bad({"model": "m"}, "input", "Missing required parameter: 'input'", id="input-missing"),
    bad(body(input=None), "input", "Missing required parameter", id="input-null"),
    bad(body(input=[]), "input", "must not be empty", id="input-empty-list"),
    bad(body(input=5), "input", "must be an array", id="input-number"),
    bad(items("hi"), "input[0]", "must be a JSON object", id="item-not-object"),
    bad(items({"role": "bot", "content": "x"}), "input[0].role", "'bot'", id="bad-role"),
    bad(items({"role": "tool", "content": "x"}), "input[0].role", "'tool'", id="role-tool"),
    bad(items({"type": "message", "content": "x"}), "input[0].role", "must be a string", id="role-missing"),
    bad(items({"role": "user", "content": 5}), "input[0].content", "must be an array", id="content-number"),
    bad(items({"role": "user"}), "input[0].content", "must be an array", id="content-missing"),
    bad(
        items({"role": "user", "content": [{"type": "input_text", "text": "see"}, IMAGE_PART]}),
        "input[0].content[1].type",
        "'input_image' is not supported",
        id="input_image",
    ),
    bad(
        items({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}),
        "input[0].content[0].type",
        "'input_file' is not supported",
        id="input_file",
    ),
    bad(
        items({"role": "user", "content": ["x"]}), "input[0].content[0]", "must be a JSON object", id="part-not-object"
    ),
    bad(
        items({"role": "user", "content": [{"type": "input_text"}]}),
        "input[0].content[0].text",
        "must be a string",
        id="part-text-missing",
    ),
    bad(
        items({"type": "item_reference", "id": "msg_1"}),
        "input[0].type",
        "'item_reference' items are not supported",
        id="item_reference",
    ),
    bad(
        items(USER_HI_ITEM, {"type": "web_search_call", "id": "ws_1", "status": "completed"}),
        "input[1].type",
        "'web_search_call'",
        id="built-in-tool-call-item",
    ),
    bad(
        items({"type": "function_call", "name": "f", "arguments": "{}"}),
        "input[0].call_id",
        "must be a string",
        id="call-id-missing",
    ),
    bad(
        items({"type": "function_call", "call_id": "c", "arguments": "{}"}),
        "input[0].name",
        "must be a string",
        id="call-name-missing",
    ),
    bad(
        items({"type": "function_call_output", "output": "x"}),
        "input[0].call_id",
        "must be a string",
        id="output-call-id-missing",
    ),
    bad(items(function_output("c", [IMAGE_PART])), "input[0].output[0].type", "'input_image'", id="output-image"),
    bad(items(function_output("c", 5)), "input[0].output", "must be an array", id="output-number"),
    bad(body(previous_response_id="abc"), "previous_response_id", "is not a response id", id="previous-id-no-prefix"),
    bad(
        body(previous_response_id="resp_"),
        "previous_response_id",
        "is not a response id",
        id="previous-id-empty-suffix",
    ),
    bad(body(previous_response_id="resp_a b"), "previous_response_id", "is not a response id", id="previous-id-space"),
    bad(body(previous_response_id=5), "previous_response_id", "must be a string", id="previous-id-number"),
    bad(body(max_output_tokens=0), "max_output_tokens", ">= 1", id="max_output_tokens-zero"),
    bad(body(max_output_tokens="8"), "max_output_tokens", "integer", id="max_output_tokens-string"),
    bad(body(temperature=3), "temperature", "<= 2", id="temperature-3"),
    bad(body(temperature=-1), "temperature", ">= 0", id="temperature-negative"),
    bad(body(top_p=1.5), "top_p", "<= 1", id="top_p-above-1"),
    bad(body(instructions=5), "instructions", "must be a string", id="instructions-number"),
    bad(body(store="yes"), "store", "must be a boolean", id="store-string"),
    bad(body(stream=1), "stream", "must be a boolean", id="stream-number"),
    bad(body(metadata="x"), "metadata", "must be a JSON object", id="metadata-string"),
    refused(body(background=True), "background", id="background"),
    refused(body(conversation="conv_1"), "conversation", id="conversation"),
    refused(body(prompt={"id": "pmpt_1"}), "prompt", id="prompt-template"),
    refused(body(top_logprobs=5), "top_logprobs", id="top_logprobs"),
    bad(body(reasoning={"effort": "extreme"}), "reasoning.effort", "'extreme'", id="effort-invalid"),
    bad(body(reasoning="high"), "reasoning", "must be a JSON object", id="reasoning-string"),
    bad(body(tools={"type": "function"}), "tools", "must be an array", id="tools-object"),
    bad(body(tools=[5]), "tools[0]", "must be a JSON object", id="tool-not-object"),
    bad(
        body(tools=[{"type": "function", "parameters": SCHEMA}]),
        "tools[0].name",
        "must be a string",
        id="tool-name-missing",
    ),
    bad(
        body(tools=[{"type": "function", "name": "f", "parameters": []}]),
        "tools[0].parameters",
        "must be a JSON object",
        id="tool-parameters-array",
    ),
    bad(body(tool_choice="required"), "tool_choice", "no function tools", id="tool_choice-required-without-tools"),
    bad(
        body(tools=[{"type": "web_search"}], tool_choice="required"),
        "tool_choice",
        "no function tools",
        id="tool_choice-required-only-built-in-tools",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "function", "name": "now"}),
        "tool_choice.name",
        "'now' is not among the tools",
        id="tool_choice-unknown-function",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "function"}),
        "tool_choice.name",
        "must be a string",
        id="tool_choice-function-no-name",
    ),
    bad(
        body(tools=[WEATHER], tool_choice="any"),
        "tool_choice",
        "must be 'none', 'auto', 'required'",
        id="tool_choice-anthropic-spelling",
    ),
    bad(
        body(tools=[WEATHER], tool_choice={"type": "web_search_preview"}),
        "tool_choice",
        "must be 'none', 'auto', 'required'",
        id="tool_choice-built-in",
    ),
    bad(body(text={"format": {"type": "xml"}}), "text.format.type", "'xml'", id="text-format-bad-type"),
    bad(
        body(text={"format": {"type": "json_schema", "name": "n"}}),
        "text.format.schema",
        "Missing required parameter",
        id="text-format-no-schema",
    ),
    bad(body(text="json"), "text", "must be a JSON object", id="text-string"),
]


@pytest.mark.parametrize(("value", "param", "gist", "code"), BAD)
def test_decode_responses_rejects(value: JsonValue, param: str | None, gist: str, code: str | None) -> None:
    """A bad Responses body is a 400 naming its field, raised before any stored history is read."""
    with pytest.raises(RequestError) as caught:
        decode_responses(value)
    error = caught.value
    assert (error.kind, error.status, error.param, error.code) == (ErrorKind.INVALID_REQUEST, 400, param, code)
    assert gist in error.message
