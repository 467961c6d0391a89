"""Agent clients' traffic, replayed through the official SDKs against the tiny demo model.

Claude Code: Messages with system blocks under `cache_control`, system
entries inside `messages`, tools, thinking with `display: "omitted"`,
`context_management` edits, a `claude-*` model name, beta headers and
`max_tokens: 32000`, streamed, over two turns with a tool round trip.
Codex: Responses with `instructions`, function + custom (Lark grammar) +
namespace + hosted tools, `store` and `previous_response_id`, streamed.
Both run on the tiny demo model, on the real default model (SmolLM2) and on
a family model (DeepSeek V3.1's template); the prompts are short enough for
SmolLM2's window and CPU prefill. The checks are on the protocol, not the
words (the demo and family weights are random).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

CLAUDE_BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"]
CLAUDE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
        "cache_control": {"type": "ephemeral"},
    },
]
SYSTEM = [
    {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
]


def claude_turn(
    server: Server, messages: list[dict[str, Any]], edits: list[dict[str, Any]], *, max_tokens: int = 32000
) -> list[Any]:
    """One streamed Claude-Code-shaped turn through the SDK's beta client; its raw events."""
    client = server.anthropic_client()
    with client.beta.messages.stream(
        model="claude-sonnet-4-5-20250929",
        max_tokens=max_tokens,
        system=SYSTEM,  # type: ignore[arg-type]
        messages=messages,  # type: ignore[arg-type]
        tools=CLAUDE_TOOLS,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 31999, "display": "omitted"},  # type: ignore[typeddict-unknown-key]
        context_management={"edits": edits},  # type: ignore[typeddict-item]
        betas=CLAUDE_BETAS,
        metadata={"user_id": "user_abc"},
        extra_query={"beta": "true"},
    ) as stream:
        return list(stream)


@pytest.fixture(scope="module", params=["smollm2", "deepseek"])
def session_server(
    request: pytest.FixtureRequest, server_factory: ServerFactory, family_servers: Callable[[str], Server]
) -> tuple[Server, bool]:
    """The real default model (SmolLM2, 8k window, no tool markup: the preamble and whole-output calls),
    and a family model: DeepSeek V3.1's real template and special tokens (its own call markup and think section);
    whether its weights are real."""
    if request.param == "smollm2":
        request.getfixturevalue("smollm2_model")
        return server_factory(model="smollm2", pinned=True), True
    return family_servers("deepseek"), False


def test_claude_code_session_two_turns_with_a_tool_round_trip(agent_server: Server) -> None:
    claude_session(agent_server)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_claude_code_session_on_real_and_family_models(session_server: tuple[Server, bool]) -> None:
    # SmolLM2's real words can run to the end of its window, minutes on a CPU: its turns are cut
    # (Claude Code's 32000, clamped to the window, is the tiny model's test and the clamp test's).
    server, real = session_server
    claude_session(server, max_tokens=32 if real else 32000)


def claude_session(agent_server: Server, *, max_tokens: int = 32000) -> None:
    first = [
        {"role": "system", "content": "<system-reminder>Today is Thursday.</system-reminder>"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "List the files.", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    events = claude_turn(
        agent_server, first, [{"type": "clear_thinking_20251015", "keep": "all"}], max_tokens=max_tokens
    )
    start = next(e for e in events if e.type == "message_start")
    assert start.message.model == "claude-sonnet-4-5-20250929"
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason in ("end_turn", "tool_use", "max_tokens")
    # keep "all" clears nothing, and says so.
    assert delta.context_management.applied_edits == []
    # `display: "omitted"`: thinking blocks (if any) carry no text.
    assert all(e.delta.type != "thinking_delta" for e in events if e.type == "content_block_delta")

    second = [
        *first,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should list them. " * 20, "signature": "sig"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "a.py\nb.py\n" * 40,
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "text", "text": "Now read a.py."},
            ],
        },
    ]
    edits = [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}},
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 0},
            "keep": {"type": "tool_uses", "value": 0},
        },
    ]
    events = claude_turn(agent_server, second, edits, max_tokens=max_tokens)
    delta = next(e for e in events if e.type == "message_delta")
    applied = {edit.type: edit for edit in delta.context_management.applied_edits}
    assert applied["clear_thinking_20251015"].cleared_thinking_turns == 1
    assert applied["clear_tool_uses_20250919"].cleared_tool_uses == 1
    # The tool result's 480 characters became a short placeholder.
    assert applied["clear_tool_uses_20250919"].cleared_input_tokens > 0
    start = next(e for e in events if e.type == "message_start")
    whole = loopback.post(
        f"{agent_server.v1}/messages/count_tokens",
        json={"model": "claude-sonnet-4-5", "system": SYSTEM, "messages": second, "tools": CLAUDE_TOOLS},
        timeout=60,
    ).json()["input_tokens"]
    # The edited prompt is what was generated from: shorter than the whole history.
    assert start.message.usage.input_tokens + (start.message.usage.cache_read_input_tokens or 0) < whole


def test_messages_max_tokens_past_the_window_is_clamped(server: Server) -> None:
    """Claude Code always asks for 32000; the tiny model's window is 2048."""
    client = server.anthropic_client()
    # The SDK insists on streaming for so large a max_tokens.
    with client.messages.stream(
        model="claude-opus-4-1", max_tokens=32000, messages=[{"role": "user", "content": "word " * 800}]
    ) as stream:
        message = stream.get_final_message()
    used = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) + message.usage.output_tokens
    assert used <= 2048
    assert message.stop_reason in ("end_turn", "max_tokens")


LARK = 'start: "*** Begin Patch\\n" LINE LINE? LINE? "*** End Patch"\nLINE: /[a-z]{1,8}\\n/'
PATCH_RE = re.compile(r"\*\*\* Begin Patch\n([a-z]{1,8}\n){1,3}\*\*\* End Patch")
CODEX_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a command.",
        "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files with a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
    },
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn_agent",
                "description": "Start a sub-agent.",
                "strict": False,
                # An enum: random weights write strings without end.
                "parameters": {
                    "type": "object",
                    "properties": {"task": {"enum": ["fix", "test"]}},
                    "required": ["task"],
                    "additionalProperties": False,
                },
            }
        ],
    },
    {"type": "web_search", "external_web_access": False},
]


def test_codex_session_custom_tool_round_trip(server: Server) -> None:
    codex_session(server)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_codex_session_on_real_and_family_models(session_server: tuple[Server, bool]) -> None:
    codex_session(session_server[0])


def codex_session(server: Server) -> None:
    client = server.client()
    events = list(
        client.responses.create(
            model="gpt-5-codex",
            instructions="You are Codex.",
            input=[
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "Sandbox: read-only."}],
                },
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]},
            ],
            tools=CODEX_TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "custom", "name": "apply_patch"},
            store=True,
            stream=True,
            max_output_tokens=200,
            prompt_cache_key="session-1",
            extra_body={"include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"}},
        )
    )
    kinds = [e.type for e in events]
    assert "response.custom_tool_call_input.delta" in kinds and "response.custom_tool_call_input.done" in kinds
    completed = events[-1]
    assert completed.type == "response.completed"
    [call] = completed.response.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    # The grammar held the whole output: the input parses.
    assert PATCH_RE.fullmatch(call.input), call.input
    done = next(e for e in events if e.type == "response.custom_tool_call_input.done")
    assert done.input == call.input

    follow = client.responses.create(
        model="gpt-5-codex",
        previous_response_id=completed.response.id,
        input=[{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}],
        tools=CODEX_TOOLS,  # type: ignore[arg-type]
        store=True,
        max_output_tokens=20,
    )
    assert follow.previous_response_id == completed.response.id
    assert follow.status in ("completed", "incomplete")
    # The stored turn replays the custom call and its output.
    items = client.responses.input_items.list(follow.id, order="asc").data
    assert [item.type for item in items][-2:] == ["custom_tool_call", "custom_tool_call_output"]


def test_codex_namespace_member_is_called_by_its_own_name(server: Server) -> None:
    client = server.client()
    response = client.responses.create(
        model="gpt-5-codex",
        input="Delegate.",
        tools=[CODEX_TOOLS[2]],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=60,
    )
    [call] = [item for item in response.output if item.type == "function_call"]
    assert (call.name, call.namespace) == ("spawn_agent", "multi_agent_v1")


def test_forcing_a_hosted_tool_is_a_400_naming_it(server: Server) -> None:
    client = server.client()
    try:
        client.responses.create(model="m", input="x", tools=[CODEX_TOOLS[3]], tool_choice={"type": "web_search"})  # type: ignore[list-item, arg-type]
    except openai.BadRequestError as error:
        assert "web_search" in str(error)
    else:
        raise AssertionError("forcing a hosted tool was accepted")


def test_count_tokens_with_context_management_reports_the_original_count(server: Server) -> None:
    history = [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should list them. " * 20, "signature": "sig"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py\n" * 40}],
        },
    ]
    edits = [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "tool_uses", "value": 0},
            "keep": {"type": "tool_uses", "value": 0},
        }
    ]
    client = server.anthropic_client()
    whole = client.messages.count_tokens(model="claude-sonnet-4-5", messages=history, tools=CLAUDE_TOOLS)  # type: ignore[arg-type]
    plain = loopback.post(
        f"{server.v1}/messages/count_tokens", json={"model": "m", "messages": history}, timeout=60
    ).json()
    # Without context management there is nothing to report.
    assert "context_management" not in plain
    counted = client.beta.messages.count_tokens(
        model="claude-sonnet-4-5",
        messages=history,
        tools=CLAUDE_TOOLS,  # type: ignore[arg-type]
        context_management={"edits": edits},
        betas=["context-management-2025-06-27"],  # type: ignore[typeddict-item]
    )
    # As Anthropic documents: the count the edits leave, and the one before them.
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == whole.input_tokens
    assert counted.input_tokens < whole.input_tokens
