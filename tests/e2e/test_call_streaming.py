"""Tool calls through the SDKs, streamed and cut off.

Streamed, a forced call arrives as OpenAI, Anthropic and the Responses API
send one (the call's head, then its arguments in pieces), and each SDK's
stream helper assembles the same call as the reply that was not streamed.
Cut off by max tokens inside its arguments, it is still a call, with the
arguments written so far, and the API's own "cut off" reason."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from tokenizers import Tokenizer

from tests.conftest import Server
from tests.e2e.conftest import stream_chunks

ASK: list[Any] = [{"role": "user", "content": "Forecast for a city."}]
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER, "strict": True},
    }
]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES_TOOLS: list[Any] = [{"name": "get_weather", "description": "Forecast", "input_schema": WEATHER}]
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Forecast", "parameters": WEATHER, "strict": True}
]
GREEDY: dict[str, Any] = {"temperature": 0}


def whole_call(client: openai.OpenAI, max_tokens: int = 120) -> tuple[str, int]:
    completion = client.chat.completions.create(
        model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice=NAMED, max_tokens=max_tokens, temperature=0
    )
    (call,) = completion.choices[0].message.tool_calls or []
    assert completion.usage is not None
    return call.function.arguments, completion.usage.completion_tokens  # type: ignore[union-attr]


def test_chat_stream_sends_the_head_then_pieces(server: Server) -> None:
    client = server.client()
    arguments, _ = whole_call(client)
    body = {
        "model": "m",
        "messages": ASK,
        "tools": CHAT_TOOLS,
        "tool_choice": NAMED,
        "max_tokens": 120,
        "temperature": 0,
    }
    chunks = [c for c in stream_chunks(server, "/chat/completions", body) if isinstance(c, dict) and c["choices"]]
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or []]  # type: ignore[index]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"].startswith("call_")
    assert all(set(call) == {"index", "function"} and set(call["function"]) == {"arguments"} for call in calls[1:])
    assert "".join(call["function"]["arguments"] for call in calls) == arguments
    with client.chat.completions.stream(
        model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice=NAMED, max_tokens=120, temperature=0
    ) as stream:
        pieces = [event.arguments_delta for event in stream if event.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls or []
    assert streamed.function.arguments == arguments == "".join(pieces)
    assert streamed.function.parsed_arguments == json.loads(arguments)
    assert final.choices[0].finish_reason == "tool_calls"


def test_messages_stream_helper_assembles_the_same_input(server: Server) -> None:
    claude = server.anthropic_client()
    ask: dict[str, Any] = {
        "model": "m",
        "max_tokens": 120,
        "messages": ASK,
        "tools": MESSAGES_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": GREEDY,
    }
    message = claude.messages.create(**ask)
    with claude.messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    (whole,) = [block for block in message.content if block.type == "tool_use"]
    (streamed,) = [block for block in final.content if block.type == "tool_use"]
    assert (streamed.name, streamed.input) == (whole.name, whole.input) and final.stop_reason == "tool_use"
    pieces = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]  # type: ignore[union-attr]
    assert json.loads("".join(pieces)) == whole.input
    # A piece per decode step that wrote some (however the frames were batched): the input did not come whole.
    assert len(pieces) >= 4
    start = next(e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use")  # type: ignore[union-attr]
    assert start.content_block.input == {}  # type: ignore[union-attr]


def test_responses_stream_helper_assembles_the_same_call(server: Server) -> None:
    client = server.client()
    ask: dict[str, Any] = {
        "model": "m",
        "input": "Forecast for a city.",
        "tools": RESPONSES_TOOLS,
        "max_output_tokens": 120,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "temperature": 0,
        "store": False,
    }
    response = client.responses.create(**ask)
    with client.responses.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (whole,) = [item for item in response.output if item.type == "function_call"]
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert (streamed.name, streamed.arguments) == (whole.name, whole.arguments)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]  # type: ignore[union-attr]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(pieces) == done.arguments == whole.arguments  # type: ignore[union-attr]
    assert len(pieces) >= 4


@pytest.fixture(scope="module")
def cut_budget(server: Server, tokenizer: Tokenizer) -> tuple[str, int]:
    """The whole call's arguments, and a max_tokens that ends the output inside them."""
    arguments, tokens = whole_call(server.client())
    head = len(tokenizer.encode('<tool_call>\n{"name": "get_weather", "arguments": {"', add_special_tokens=False).ids)
    # Halfway between the arguments' start and the closer and EOS that end the output.
    return arguments, (head + tokens - 3) // 2


def test_chat_call_cut_by_max_tokens(server: Server, cut_budget: tuple[str, int]) -> None:
    arguments, budget = cut_budget
    completion = server.client().chat.completions.create(
        model="m", messages=ASK, tools=CHAT_TOOLS, tool_choice=NAMED, max_tokens=budget, temperature=0
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    cut = call.function.arguments  # type: ignore[union-attr]
    assert cut and arguments.startswith(cut) and cut != arguments
    body = {
        "model": "m",
        "messages": ASK,
        "tools": CHAT_TOOLS,
        "tool_choice": NAMED,
        "max_tokens": budget,
        "temperature": 0,
    }
    chunks = [c for c in stream_chunks(server, "/chat/completions", body) if isinstance(c, dict) and c["choices"]]
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or []]  # type: ignore[index]
    assert "".join(call["function"]["arguments"] for call in calls) == cut
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]


def test_messages_call_cut_by_max_tokens(server: Server, cut_budget: tuple[str, int]) -> None:
    _, budget = cut_budget
    claude = server.anthropic_client()
    ask: dict[str, Any] = {
        "model": "m",
        "max_tokens": budget,
        "messages": ASK,
        "tools": MESSAGES_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": GREEDY,
    }
    message = claude.messages.create(**ask)
    assert message.stop_reason == "max_tokens"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.id.startswith("toolu_")
    with claude.messages.stream(**ask) as stream:
        final = stream.get_final_message()
    # The SDK reads the cut-off pieces as a partial object; the reply's input is that same object.
    assert final.stop_reason == "max_tokens" and final.content[0].input == block.input  # type: ignore[union-attr]


def test_responses_call_cut_by_max_tokens(server: Server, cut_budget: tuple[str, int]) -> None:
    arguments, budget = cut_budget
    response = server.client().responses.create(
        model="m",
        input="Forecast for a city.",
        tools=RESPONSES_TOOLS,
        max_output_tokens=budget,
        temperature=0,
        store=False,
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    (item,) = response.output
    assert item.type == "function_call" and item.status == "incomplete" and item.name == "get_weather"
    assert arguments.startswith(item.arguments) and item.arguments != arguments
