"""A forced tool call beside a response format, through each API's SDK: the call follows its tool's
schema (the format governs text, and a forced turn writes none), as OpenAI's and Anthropic's APIs
accept it; under `auto`, text follows the format and a call its tool's schema."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from tests.conftest import Server

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 16}},
    "required": ["answer"],
    "additionalProperties": False,
}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}}
CHAT_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
@pytest.mark.parametrize("seed", [1, 2])
def test_chat_forced_call_beside_response_format(client: openai.OpenAI, choice: object, seed: int) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[CHAT_TOOL],
        tool_choice=choice,  # type: ignore[arg-type]
        response_format=CHAT_FORMAT,  # type: ignore[arg-type]
        max_tokens=120,
        seed=seed,
        parallel_tool_calls=False,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "tool_calls"
    [call] = message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)  # type: ignore[union-attr]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
def test_messages_forced_call_beside_output_format(server: Server, choice: dict[str, str]) -> None:
    message = server.anthropic_client().messages.create(
        model="m",
        max_tokens=120,
        messages=ASK,  # type: ignore[arg-type]
        tools=[{"name": "get_weather", "description": "Forecast", "input_schema": WEATHER}],
        tool_choice={**choice, "disable_parallel_tool_use": True},  # type: ignore[typeddict-item]
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": ANSWER}}},
    )
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert isinstance(block, anthropic.types.ToolUseBlock) and block.name == "get_weather"
    jsonschema.validate(block.input, WEATHER)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}], ids=["required", "named"])
def test_responses_forced_call_beside_text_format(client: openai.OpenAI, choice: object) -> None:
    response = client.responses.create(
        model="m",
        input="Weather in Paris?",
        max_output_tokens=120,
        parallel_tool_calls=False,
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}],
        tool_choice=choice,  # type: ignore[arg-type]
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}},
    )
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def opener_bias(tokenizer: Tokenizer, weight: int) -> dict[str, int]:
    return {str(tokenizer.token_to_id("<tool_call>")): weight}


def test_auto_beside_a_format_writes_a_call_when_the_model_opens_one(
    client: openai.OpenAI, tokenizer: Tokenizer
) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[CHAT_TOOL],
        response_format=CHAT_FORMAT,  # type: ignore[arg-type]
        max_tokens=120,
        seed=3,
        parallel_tool_calls=False,
        logit_bias=opener_bias(tokenizer, 100),
    )
    [call] = completion.choices[0].message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", [1, 2])
def test_auto_beside_a_format_writes_text_in_the_format(client: openai.OpenAI, tokenizer: Tokenizer, seed: int) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[CHAT_TOOL],
        response_format=CHAT_FORMAT,  # type: ignore[arg-type]
        max_tokens=120,
        seed=seed,
        logit_bias=opener_bias(tokenizer, -100),
    )
    message = completion.choices[0].message
    assert not message.tool_calls
    jsonschema.validate(json.loads(message.content or ""), ANSWER)
