"""OpenCode- and Continue-shaped chat sessions through the openai SDK, on the
real default model (SmolLM2) and a family model (DeepSeek V3.1's template,
whose think section the request opens).

OpenCode (over the AI SDK's openai-compatible provider) streams with
`stream_options.include_usage`, offers its tools with `tool_choice`, and
sends the turn's `reasoning_content` back with the assistant's tool calls;
Continue sends content as text parts, `reasoning` on past turns and stop
sequences, and in chat mode a history with its agent mode's calls but no
tools. Checked: every turn is a 200
that streams a well-formed answer, a forced call parses with
schema-valid arguments, and the tool results render into the next prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import jsonschema
import openai
import pytest

from tests.conftest import Server, ServerFactory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Small on purpose: SmolLM2's quantized CPU prefill is slow, and the tools are in every prompt.
READ = {
    "type": "object",
    "properties": {"filePath": {"type": "string", "enum": ["app.py", "README.md"]}},
    "required": ["filePath"],
    "additionalProperties": False,
    "$schema": "http://json-schema.org/draft-07/schema#",
}
BASH = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": ["ls", "git status"]},
        "description": {"type": "string", "maxLength": 12},
    },
    "required": ["command", "description"],
    "additionalProperties": False,
    "$schema": "http://json-schema.org/draft-07/schema#",
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "read", "description": "Reads a file.", "parameters": READ}},
    {"type": "function", "function": {"name": "bash", "description": "Runs a command.", "parameters": BASH}},
]
SCHEMAS = {"read": READ, "bash": BASH}
SYSTEM = "You are opencode, a coding agent.\n<env>Platform: linux</env>"


@attrs.define
class Turn:
    content: str = ""
    reasoning: str = ""
    calls: dict[int, dict[str, str]] = attrs.field(factory=dict)
    finish: str | None = None
    usage: Any = None


@pytest.fixture(scope="module", params=["smollm2", "deepseek"])
def replay(
    request: pytest.FixtureRequest, server_factory: ServerFactory, family_servers: Callable[[str], Server]
) -> tuple[Server, dict[str, Any]]:
    """A server and the extra body its client sends (DeepSeek's think switch)."""
    if request.param == "smollm2":
        request.getfixturevalue("smollm2_model")
        return server_factory(model="smollm2", pinned=True), {}
    return family_servers(request.param), {"chat_template_kwargs": {"thinking": True}}


def stream_turn(client: openai.OpenAI, messages: list[Any], extra: dict[str, Any], **fields: Any) -> Turn:
    """One OpenCode-shaped streamed turn, assembled from its chunks as the AI SDK assembles them."""
    turn = Turn()
    stream = client.chat.completions.create(
        model="opencode/model",
        messages=messages,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
        temperature=0,
        extra_body=extra,
        **fields,
    )
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            turn.usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            turn.content += delta.content or ""
            turn.reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or []:
                slot = turn.calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += (call.function.name if call.function else None) or ""
                slot["arguments"] += (call.function.arguments if call.function else None) or ""
            turn.finish = choice.finish_reason or turn.finish
    assert turn.usage is not None and turn.finish is not None
    return turn


def test_opencode_session_with_a_tool_round_trip_and_reasoning_sent_back(replay: tuple[Server, dict[str, Any]]) -> None:
    server, extra = replay
    client = server.client(timeout=300.0)
    history: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is in this project?"},
    ]
    first = stream_turn(client, history, extra, tool_choice="required", max_tokens=64)
    assert first.finish == "tool_calls" and first.calls
    for call in first.calls.values():
        assert call["id"] and call["name"] in SCHEMAS
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    assistant = {
        "role": "assistant",
        "content": first.content or None,
        # OpenCode replays the turn's reasoning with its calls (interleaved thinking).
        "reasoning_content": first.reasoning or "I should look at the files first.",
        "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
            for call in first.calls.values()
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": "app.py\nREADME.md\npyproject.toml\n" * 2}
        for call in first.calls.values()
    ]
    second = stream_turn(client, [*history, assistant, *results], extra, tool_choice="auto", max_tokens=8)
    assert second.finish in ("stop", "length", "tool_calls")
    # The calls and their results are in the prompt the template rendered.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10 * len(results)
    assert second.usage.completion_tokens >= 1


def test_continue_session_with_text_parts_reasoning_and_stops(replay: tuple[Server, dict[str, Any]]) -> None:
    server, extra = replay
    client = server.client(timeout=300.0)
    messages: list[Any] = [
        {"role": "system", "content": [{"type": "text", "text": "You are a coding assistant."}]},
        {"role": "user", "content": [{"type": "text", "text": "Run ls."}]},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "The user wants a listing.",
            "tool_calls": [
                {
                    "id": "tc_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls", "description": "list"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "tc_1", "content": [{"type": "text", "text": "app.py\n"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks. Summarize in one line."}]},
    ]
    # Continue's chat mode offers no tools; the history still holds the agent mode's call and result.
    reply = client.chat.completions.create(
        model="continue/model",
        messages=messages,
        stop=["\n\n\n"],
        max_tokens=8,
        temperature=0,
        extra_body=extra,
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert "\n\n\n" not in (choice.message.content or "")
    assert reply.usage is not None and reply.usage.completion_tokens >= 1


def test_a_response_format_on_an_opened_think_section_is_the_answer(replay: tuple[Server, dict[str, Any]]) -> None:
    server, extra = replay
    if not extra:
        pytest.skip("only the family model's template opens a think section")
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    reply = server.client().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Is it ok?"}],
        max_tokens=16,
        temperature=0,
        extra_body=extra,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    message = reply.choices[0].message
    # The grammar writes the answer from the first token: none of it is reasoning.
    assert json.loads(message.content or "") in ({"ok": True}, {"ok": False})
    assert not (message.model_extra or {}).get("reasoning_content")
