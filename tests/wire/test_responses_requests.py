"""wire/responses_requests.py: OpenAI Responses JSON → the validated request, then the chat request.

`decode_responses` is checked as a table of bodies and the exact
`ResponsesRequest` (echo included). The bad bodies are in
test_responses_requests_refused.py; `to_chat`, `continued_input` and the
replay of a response's own output are in test_responses_to_chat.py.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from pipeline.requests import (
    Constraint,
    ConstraintKind,
    GenerationParams,
    JsonObject,
    JsonValue,
    Message,
    Role,
    Sampling,
    Tool,
    ToolChoice,
    ToolChoiceMode,
)
from wire.responses_requests import ResponsesRequest, decode_responses
from wire.responses_tools import ToolSpec

UNSUPPORTED = "unsupported_parameter"
SCHEMA: dict[str, JsonValue] = {"type": "object", "properties": {"n": {"type": "integer"}}}
WEATHER: dict[str, JsonValue] = {"type": "function", "name": "get_weather", "description": "Now.", "parameters": SCHEMA}
WEATHER_TOOL = Tool(name="get_weather", description="Now.", parameters=SCHEMA)
WEATHER_ECHO: dict[str, JsonValue] = {**WEATHER, "strict": False}
LARK = 'start: "*** Begin Patch" LF body "*** End Patch"\nbody: /[^*]*/\nLF: "\\n"'
PATCH: dict[str, JsonValue] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
}
PATCH_SPEC = ToolSpec(
    kind="custom",
    name="apply_patch",
    grammar=Constraint(kind=ConstraintKind.GRAMMAR, spec=LARK, param="tools[0].format.definition"),
)
PATCH_TOOL = Tool(
    name="apply_patch",
    description=f"Edit files.\n\nThe `input` argument is freeform text that must match this Lark grammar:\n{LARK}",
    parameters={"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
    input_grammar=PATCH_SPEC.grammar,
)
USER_HI_ITEM: JsonObject = {"type": "message", "role": "user", "content": "hi"}
HI = Message(role=Role.USER, content="hi")


def body(**fields: JsonValue) -> dict[str, JsonValue]:
    return {"model": "m", "input": "hi", **fields}


def echo(**fields: JsonValue) -> JsonObject:
    defaults: JsonObject = {
        "max_output_tokens": None,
        "max_tool_calls": None,
        "temperature": None,
        "top_p": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
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
    tool_specs: dict[str, ToolSpec] | None = None,
    skipped_tools: tuple[str, ...] = (),
    grammar_call: str | None = None,
    truncate: bool = False,
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
        truncate=truncate,
        echo=echoed or echo(),
        tool_specs=tool_specs
        if tool_specs is not None
        else {t.name: ToolSpec(kind="function", name=t.name) for t in tools},
        skipped_tools=skipped_tools,
        grammar_call=grammar_call,
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
            truncate=True,
            echoed=echo(metadata={"k": "v"}, parallel_tool_calls=False, truncation="auto", user="u1"),
        ),
        id="echoed-fields",
    ),
    pytest.param(
        body(tools=[WEATHER]), request(tools=(WEATHER_TOOL,), echoed=echo(tools=[WEATHER_ECHO])), id="function-tool"
    ),
    pytest.param(
        body(tools=[{"type": "web_search"}, WEATHER, {"type": "file_search", "vector_store_ids": ["vs_1"]}]),
        request(
            tools=(WEATHER_TOOL,),
            skipped_tools=("web_search", "file_search"),
            echoed=echo(
                tools=[{"type": "web_search"}, WEATHER_ECHO, {"type": "file_search", "vector_store_ids": ["vs_1"]}]
            ),
        ),
        id="hosted-tools-not-offered-but-reported",
    ),
    pytest.param(
        body(tools=[PATCH]),
        request(tools=(PATCH_TOOL,), tool_specs={"apply_patch": PATCH_SPEC}, echoed=echo(tools=[PATCH])),
        id="custom-tool-offered-as-one-string-argument",
    ),
    pytest.param(
        body(tools=[PATCH], tool_choice={"type": "custom", "name": "apply_patch"}),
        request(
            tools=(PATCH_TOOL,),
            tool_specs={"apply_patch": PATCH_SPEC},
            constraint=attrs.evolve(PATCH_SPEC.grammar, whole_output=True),
            grammar_call="apply_patch",
            echoed=echo(tools=[PATCH], tool_choice={"type": "custom", "name": "apply_patch"}),
        ),
        id="forced-custom-tool-with-grammar-constrains-the-whole-output",
    ),
    pytest.param(
        body(tools=[{"type": "namespace", "name": "crm", "description": "CRM.", "tools": [WEATHER]}]),
        request(
            tools=(attrs.evolve(WEATHER_TOOL, name="crm.get_weather"),),
            tool_specs={"crm.get_weather": ToolSpec(kind="function", name="get_weather", namespace="crm")},
            echoed=echo(tools=[{"type": "namespace", "name": "crm", "description": "CRM.", "tools": [WEATHER]}]),
        ),
        id="namespace-members-under-qualified-names",
    ),
    pytest.param(
        body(
            input=[
                USER_HI_ITEM,
                {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch\n"},
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "get_weather",
                    "namespace": "crm",
                    "arguments": "{}",
                },
                {"type": "function_call_output", "call_id": "c2", "output": "Sunny"},
            ]
        ),
        request(
            USER_HI_ITEM,
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch\n"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "namespace": "crm", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c2", "output": "Sunny"},
        ),
        id="custom-and-namespaced-calls-replay",
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
        request(
            template_kwargs={"enable_thinking": True, "reasoning_effort": "high"},
            echoed=echo(reasoning={"effort": "high", "summary": None}),
        ),
        id="effort-high",
    ),
    pytest.param(
        body(reasoning={"effort": "low"}),
        request(
            template_kwargs={"enable_thinking": True, "reasoning_effort": "low"},
            echoed=echo(reasoning={"effort": "low", "summary": None}),
        ),
        id="effort-low",
    ),
    pytest.param(
        body(reasoning={"effort": "minimal"}),
        request(
            template_kwargs={"enable_thinking": False, "reasoning_effort": "low"},
            echoed=echo(reasoning={"effort": "minimal", "summary": None}),
        ),
        id="effort-minimal",
    ),
    pytest.param(
        body(reasoning={"effort": "none"}),
        request(
            template_kwargs={"enable_thinking": False, "reasoning_effort": "low"},
            echoed=echo(reasoning={"effort": "none", "summary": None}),
        ),
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
