"""One recorded agent conversation as each client sends it: Claude Code's Messages bodies, Codex's Responses
bodies, and the same conversation as Chat Completions messages for the servers that speak only that.

The bodies are the project's own fixtures of those clients (tests/e2e/test_agent_sessions.py): Claude Code's
system blocks under `cache_control`, its system reminder sent as a message, its tools, thinking with
`display: "omitted"`, a `context_management` edit, a `claude-*` model name and its beta headers; Codex's
`instructions`, a developer message, its function, custom (Lark grammar), namespace and hosted tools,
`tool_choice: "auto"`, `prompt_cache_key` and `include`. Codex over HTTP sends the whole input every turn
with `store: false` (its WebSocket transport alone sends only the new items after a `previous_response_id`),
so each Codex body here carries the whole conversation.

A conversation is the client's task and then one tool round trip a turn: the assistant's words (the model's
answer to the turn before, or a recorded opener on the first), its call that reads a file, and the call's
result, a file's worth of this repository's source. Each request ends with a tool result, as an agent's do.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from tests.e2e.test_agent_sessions import CLAUDE_BETAS, CLAUDE_TOOLS, CODEX_TOOLS, SYSTEM

TASK = "Read this repository's files one at a time and say in one sentence what each one does."
OPENER = "I'll read the first file."
REMINDER = "<system-reminder>Today is Thursday.</system-reminder>"
CODEX_INSTRUCTIONS = "You are Codex."
CODEX_DEVELOPER = "Sandbox: read-only."
Body = dict[str, Any]
# Claude Code asks for 32000 tokens with a budget of 31999; the replay's short answers keep the least budget
# the Messages API takes (1024), so the body still turns thinking on (the model has no think markup).
_THINKING_BUDGET = 1024


@attrs.frozen
class Step:
    """One tool round trip: the words before the call, the file it read, and the file's text."""

    words: str
    path: str
    text: str


def claude_request(steps: list[Step], max_tokens: int) -> tuple[str, Body, dict[str, str]]:
    """Claude Code's turn: the path (with its `?beta=true`), the Messages body and its headers."""
    messages: list[Body] = [
        {"role": "system", "content": REMINDER},
        {"role": "user", "content": [{"type": "text", "text": TASK}]},
    ]
    for index, step in enumerate(steps):
        call = {"type": "tool_use", "id": f"toolu_{index}", "name": "Read", "input": {"file_path": step.path}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": step.words}, call]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{index}", "content": step.text}
        messages.append({"role": "user", "content": [result]})
    # Claude Code moves its last cache breakpoint to the newest message each turn.
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": max_tokens,
        "system": SYSTEM,
        "messages": messages,
        "tools": CLAUDE_TOOLS,
        "thinking": {"type": "enabled", "budget_tokens": _THINKING_BUDGET, "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "user_abc"},
        "temperature": 0.0,
        "stream": True,
    }
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": ",".join(CLAUDE_BETAS), "x-api-key": "unused"}
    return "/v1/messages?beta=true", body, headers


def codex_request(steps: list[Step], max_tokens: int) -> tuple[str, Body, dict[str, str]]:
    """Codex's turn over HTTP: the whole input, streamed, not stored."""
    items: list[Body] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": CODEX_DEVELOPER}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]},
    ]
    for index, step in enumerate(steps):
        words = [{"type": "output_text", "text": step.words}]
        items.append({"type": "message", "role": "assistant", "content": words})
        arguments = json.dumps({"cmd": f"cat {step.path}"})
        items.append(
            {"type": "function_call", "call_id": f"call_{index}", "name": "exec_command", "arguments": arguments}
        )
        items.append({"type": "function_call_output", "call_id": f"call_{index}", "output": step.text})
    body = {
        "model": "gpt-5-codex",
        "instructions": CODEX_INSTRUCTIONS,
        "input": items,
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "stream": True,
        "max_output_tokens": max_tokens,
        "temperature": 0.0,
        "prompt_cache_key": "agent-replay",
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto"},
    }
    return "/v1/responses", body, {"authorization": "Bearer unused"}


def chat_request(client: str, steps: list[Step], max_tokens: int) -> tuple[str, Body, dict[str, str]]:
    """`client`'s conversation as Chat Completions: the same system text, calls, tool results and tools."""
    if client == "claude":
        # As mlx-relay reads Messages: the system blocks joined, then the reminder folded in after a blank line.
        system = ["".join(block["text"] for block in SYSTEM) + "\n\n" + REMINDER]
        tools, call = _chat_tools(CLAUDE_TOOLS), ("Read", lambda path: {"file_path": path})
    else:
        system = [CODEX_INSTRUCTIONS, CODEX_DEVELOPER]
        tools, call = _chat_tools(CODEX_TOOLS), ("exec_command", lambda path: {"cmd": f"cat {path}"})
    messages: list[Body] = [{"role": "system", "content": text} for text in system]
    messages.append({"role": "user", "content": TASK})
    for index, step in enumerate(steps):
        function = {"name": call[0], "arguments": json.dumps(call[1](step.path))}
        tool_call = {"id": f"call_{index}", "type": "function", "function": function}
        messages.append({"role": "assistant", "content": step.words, "tool_calls": [tool_call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": step.text})
    body = {
        "messages": messages,
        "tools": tools,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return "/v1/chat/completions", body, {}


def _chat_tools(tools: list[Body]) -> list[Body]:
    """Chat Completions' function tools for a client's: a custom tool takes its text as one string argument,
    a namespace's members are listed by their own names, and hosted tools (run by the provider) are left out."""
    chat: list[Body] = []
    for tool in tools:
        kind = tool.get("type", "function")
        if "input_schema" in tool:
            chat.append(_function(tool["name"], tool["description"], tool["input_schema"]))
        elif kind == "function":
            chat.append(_function(tool["name"], tool["description"], tool["parameters"]))
        elif kind == "custom":
            schema = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
            chat.append(_function(tool["name"], tool["description"], schema))
        elif kind == "namespace":
            chat.extend(_chat_tools(tool["tools"]))
    return chat


def _function(name: str, description: str, parameters: Body) -> Body:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def relay_chat_request(client: str, steps: list[Step], max_tokens: int) -> tuple[str, Body, dict[str, str]]:
    """`client`'s body as the chat messages mlx-relay hands a template that ignores tools (SmolLM2's, Gemma 3's):
    its own tool preamble, the tools described in the system message and calls and results written as text
    (stages/families/preamble.py). A peer whose template drops the tools (mlx_lm.server warns "Received tools
    but model does not support tool calling") is sent these, so it prefills the prompt mlx-relay prefills."""
    from stages.families.plain import FAMILY
    from stages.families.preamble import tool_preamble
    from wire.anthropic_requests import decode_messages
    from wire.responses_requests import decode_responses, to_chat

    if client == "claude":
        # Claude Code's interleaved-thinking beta lets the budget pass max_tokens, as the route reads it.
        chat = decode_messages(claude_request(steps, max_tokens)[1], interleaved_thinking=True)
    else:
        responses = decode_responses(codex_request(steps, max_tokens)[1])
        chat = to_chat(responses, (), responses.instructions)
    messages = tool_preamble(FAMILY, chat.tools, chat.messages)
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    return "/v1/chat/completions", body | {"stream_options": {"include_usage": True}}, {}
