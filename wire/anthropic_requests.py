"""Anthropic Messages requests → internal chat requests.

Pure functions over decoded JSON (docs/STYLE.md, "Pure wire"). `system` becomes the leading
system message; user `tool_result` blocks become tool messages; assistant
`tool_use` and `thinking` blocks become the turn's tool calls and
reasoning; a final assistant message is a prefill the answer continues.
Fields that cannot change the output (`metadata`, `service_tier`,
`cache_control`, `speed`) are ignored; ones that would and are not served
are refused by name. `output_config.effort` sets the template's reasoning
level (gpt-oss's low/medium/high), as `reasoning_effort` does for OpenAI.
`mcp_servers` is the MCP connector's, read with its beta (wire/anthropic_mcp.py) and refused naming the
header without it; its `mcp_tool_use` and `mcp_tool_result` blocks, sent back in an assistant turn, are
a call and its result, as `tool_use` and `tool_result` are.
"""

from __future__ import annotations

import json

from pipeline.errors import invalid, quote, unsupported
from pipeline.requests import (
    ChatRequest,
    GenerationParams,
    ImagePart,
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
from wire.anthropic_context import read_context_management
from wire.field_reads import (
    Body,
    as_body,
    as_list,
    as_object,
    as_str,
    named_tool,
    read_bool,
    read_function,
    read_int,
    read_number,
    read_stops,
)
from wire.image_parts import image_from_base64, image_from_url
from wire.structured import anthropic_constraint

_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT}
_REFUSED_FIELDS = ("container",)
# The MCP connector's betas; without one, `mcp_servers` is refused naming the header (wire/anthropic_mcp.py).
MCP_BETAS = ("mcp-client-2025-04-04", "mcp-client-2025-11-20")
_DISPLAYS = ("summarized", "omitted")
_MIN_THINKING_BUDGET = 1024


def decode_messages(value: JsonValue, *, interleaved_thinking: bool = False, connector: bool = False) -> ChatRequest:
    """A `POST /v1/messages` body; `interleaved_thinking` (its beta asked in `anthropic-beta`) lets the
    thinking budget pass `max_tokens`, as Anthropic's does: the budget then spans the turn's thinking blocks.

    With `connector` (the MCP connector's beta asked), `mcp_servers`, the `mcp_toolset` tools and
    `tool_choice` are left to wire/anthropic_mcp.py, which reads them against the servers' tools."""
    body = as_body(value)
    max_tokens = _read_max_tokens(body)
    budget = _thinking_budget(body)
    if budget is not None and budget >= max_tokens and not interleaved_thinking:
        # Anthropic's words; thinking counts toward max_tokens, so the answer needs room after it.
        raise invalid("`max_tokens` must be greater than `thinking.budget_tokens`", param="max_tokens")
    return _decode(body, max_tokens=max_tokens, connector=connector)


def decode_count_tokens(value: JsonValue) -> ChatRequest:
    """A `POST /v1/messages/count_tokens` body: a Messages body without `max_tokens`."""
    return _decode(as_body(value), max_tokens=1)


def _decode(body: Body, *, max_tokens: int, connector: bool = False) -> ChatRequest:
    for key in _REFUSED_FIELDS:
        if body.get(key) is not None:
            raise unsupported(key)
    if not connector and body.get("mcp_servers") is not None:
        raise invalid(
            f"mcp_servers: the MCP connector is a beta; send the header `anthropic-beta: {MCP_BETAS[0]}` "
            f"(or `{MCP_BETAS[1]}`) to use it",
            param="mcp_servers",
        )
    model = as_str(body.get("model"), "model")
    system, messages = _read_messages(body)
    tools = _read_tools(body, connector=connector)
    return ChatRequest(
        messages=_read_system(body, system) + messages,
        params=GenerationParams(
            max_tokens=max_tokens,
            clamp_max_tokens=True,
            sampling=_read_sampling(body),
            stop=read_stops(body.get("stop_sequences"), "stop_sequences", allow_string=False),
            # `task_budget` is advisory; `format` constrains; `effort` is a template argument.
            constraint=anthropic_constraint(body),
            thinking_budget=_thinking_budget(body),
        ),
        template_kwargs={**_read_thinking(body), **_read_effort(body)},
        tools=tools,
        # The connector's first round reads the choice once the servers' tools are known.
        tool_choice=ToolChoice() if connector else read_tool_choice(body, tools),
        parallel_tool_calls=not _disables_parallel(body),
        continue_final=messages[-1].role is Role.ASSISTANT,
        stream=bool(read_bool(body, "stream")),
        context_edits=read_context_management(body),
        model=model,
        omit_reasoning=_omits_thinking(body),
    )


def _read_max_tokens(body: Body) -> int:
    value = read_int(body, "max_tokens", minimum=1)
    if value is None:
        raise invalid("max_tokens: Field required", param="max_tokens")
    return value


def _read_system(body: Body, folded: list[str]) -> tuple[Message, ...]:
    """One system message: the `system` field, then any `system` entries of `messages`, in order."""
    raw = body.get("system")
    texts = [] if raw is None else [raw if isinstance(raw, str) else _text_of_blocks(as_list(raw, "system"), "system")]
    texts.extend(folded)
    if not texts:
        return ()
    return (Message(role=Role.SYSTEM, content="\n\n".join(text for text in texts if text)),)


def _read_messages(body: Body) -> tuple[list[str], tuple[Message, ...]]:
    """The system texts found among the messages, and the conversation itself."""
    raw = body.get("messages")
    if raw is None:
        raise invalid("messages: Field required", param="messages")
    items = as_list(raw, "messages")
    if not items:
        raise invalid("messages: at least one message is required", param="messages")
    system: list[str] = []
    messages: list[Message] = []
    for index, item in enumerate(items):
        param = f"messages.{index}"
        entry = as_object(item, param)
        if entry.get("role") == "system":
            # Claude Code sends system reminders as messages; Anthropic folds them into the system prompt.
            system.append(_system_entry(entry, param))
            continue
        messages.extend(_read_message(entry, param))
    if not messages:
        raise invalid("messages: every message is empty", param="messages")
    return system, tuple(messages)


def _system_entry(item: JsonObject, param: str) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return _text_of_blocks(as_list(content, f"{param}.content"), f"{param}.content")


def _read_message(item: JsonObject, param: str) -> list[Message]:
    role_name = as_str(item.get("role"), f"{param}.role")
    role = _ROLES.get(role_name)
    if role is None:
        raise invalid(f"{param}.role: Input should be 'user', 'assistant' or 'system'", param=f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        return [Message(role=role, content=content)]
    blocks = [as_object(block, f"{param}.content.{i}") for i, block in enumerate(as_list(content, f"{param}.content"))]
    if role is Role.ASSISTANT:
        return assistant_turns(blocks, f"{param}.content")
    return _user_turns(blocks, f"{param}.content")


def assistant_turns(blocks: list[JsonObject], param: str) -> list[Message]:
    """An assistant message's blocks; each `mcp_tool_result` (the MCP connector's, in the assistant's own
    content) ends the assistant turn before it and becomes a tool message, as a client's `tool_result` does."""
    turns: list[Message] = []
    texts: list[str] = []
    calls: list[ToolCallRecord] = []
    reasoning: list[str] = []
    for index, block in enumerate(blocks):
        kind, where = block.get("type"), f"{param}.{index}"
        if kind == "mcp_tool_result":
            if texts or calls or reasoning:
                turns.append(_assistant(texts, calls, reasoning))
                texts, calls, reasoning = [], [], []
            turns.append(_tool_result(block, where))
        elif kind == "text":
            texts.append(as_str(block.get("text"), f"{where}.text"))
        elif kind in ("tool_use", "mcp_tool_use"):
            arguments = as_object(block.get("input", {}), f"{where}.input")
            call_id = as_str(block.get("id"), f"{where}.id")
            calls.append(
                ToolCallRecord(
                    id=call_id, name=as_str(block.get("name"), f"{where}.name"), arguments=json.dumps(arguments)
                )
            )
        elif kind == "thinking":
            reasoning.append(as_str(block.get("thinking"), f"{where}.thinking"))
        elif kind != "redacted_thinking":
            raise _unsupported_block(kind, where)
    if texts or calls or reasoning or not turns:
        turns.append(_assistant(texts, calls, reasoning))
    return turns


def _assistant(texts: list[str], calls: list[ToolCallRecord], reasoning: list[str]) -> Message:
    return Message(
        role=Role.ASSISTANT, content="".join(texts), tool_calls=tuple(calls), reasoning="".join(reasoning) or None
    )


def _user_turns(blocks: list[JsonObject], param: str) -> list[Message]:
    """Tool results first (they answer the previous turn), then the user's text."""
    results, texts, images = [], [], []
    for index, block in enumerate(blocks):
        kind, where = block.get("type"), f"{param}.{index}"
        if kind == "text":
            texts.append(as_str(block.get("text"), f"{where}.text"))
        elif kind == "image":
            images.append(_image_block(block, where, offset=sum(map(len, texts))))
        elif kind == "tool_result":
            results.append(_tool_result(block, where))
        else:
            raise _unsupported_block(kind, where)
    turn = Message(role=Role.USER, content="".join(texts), images=tuple(images))
    return results + ([turn] if texts or images else [])


def _image_block(block: JsonObject, where: str, *, offset: int) -> ImagePart:
    source = as_object(block.get("source"), f"{where}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type = as_str(source.get("media_type"), f"{where}.source.media_type")
        return image_from_base64(
            as_str(source.get("data"), f"{where}.source.data"), media_type, param=where, offset=offset
        )
    if kind == "url":
        return image_from_url(as_str(source.get("url"), f"{where}.source.url"), param=where, offset=offset)
    raise invalid(
        f"{where}.source.type: Input should be 'base64' or 'url', got {quote(kind)}", param=f"{where}.source.type"
    )


def _tool_result(block: JsonObject, where: str) -> Message:
    content = block.get("content", "")
    text = (
        content
        if isinstance(content, str)
        else _text_of_blocks(as_list(content, f"{where}.content"), f"{where}.content")
    )
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return Message(role=Role.TOOL, content=text, tool_call_id=as_str(block.get("tool_use_id"), f"{where}.tool_use_id"))


def _text_of_blocks(blocks: list[JsonValue], param: str) -> str:
    texts = []
    for index, raw in enumerate(blocks):
        block = as_object(raw, f"{param}.{index}")
        if block.get("type") != "text":
            raise _unsupported_block(block.get("type"), f"{param}.{index}")
        texts.append(as_str(block.get("text"), f"{param}.{index}.text"))
    return "".join(texts)


def _unsupported_block(kind: JsonValue, where: str) -> Exception:
    if kind in ("image", "document"):
        return invalid(f"{where}: '{kind}' content is not supported here", param=where)
    return invalid(f"{where}.type: unsupported content block type {quote(kind)}", param=f"{where}.type")


def _read_sampling(body: Body) -> Sampling:
    top_k = read_int(body, "top_k", minimum=0)
    return Sampling(
        temperature=_or(read_number(body, "temperature", minimum=0, maximum=1), 1.0),
        top_p=_or(read_number(body, "top_p", minimum=0, maximum=1), 1.0),
        top_k=top_k or 0,
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _read_tools(body: Body, *, connector: bool) -> tuple[Tool, ...]:
    raw = body.get("tools")
    if raw is None:
        return ()
    tools = []
    for index, value in enumerate(as_list(raw, "tools")):
        item = as_object(value, f"tools.{index}")
        if connector and item.get("type") == "mcp_toolset":
            continue
        if item.get("type", "custom") != "custom":
            raise unsupported(f"tools.{index}.type")
        tools.append(read_function(item, f"tools.{index}", schema_key="input_schema"))
    return tuple(tools)


def read_tool_choice(body: Body, tools: tuple[Tool, ...]) -> ToolChoice:
    raw = body.get("tool_choice")
    if raw is None:
        return ToolChoice()
    choice = as_object(raw, "tool_choice")
    kind = choice.get("type")
    if kind == "auto":
        return ToolChoice()
    if kind == "none":
        return ToolChoice(mode=ToolChoiceMode.NONE)
    if kind not in ("any", "tool"):
        raise invalid("tool_choice.type: must be 'auto', 'any', 'tool' or 'none'", param="tool_choice.type")
    if not tools:
        raise invalid("tool_choice: there are no tools to choose from", param="tool_choice")
    if kind == "any":
        return ToolChoice(mode=ToolChoiceMode.REQUIRED)
    return named_tool(choice.get("name"), tools, "tool_choice.name")


def _disables_parallel(body: Body) -> bool:
    choice = body.get("tool_choice")
    return isinstance(choice, dict) and read_bool(choice, "disable_parallel_tool_use") is True


def _thinking_budget(body: Body) -> int | None:
    """`thinking.budget_tokens` of enabled thinking: the sampler closes the think section when it is spent."""
    raw = body.get("thinking")
    if not isinstance(raw, dict) or raw.get("type") != "enabled":
        return None
    budget = read_int(raw, "budget_tokens")
    if budget is not None and budget < _MIN_THINKING_BUDGET:
        # Anthropic's words and floor (its request validator's wording for the field).
        raise invalid(
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {_MIN_THINKING_BUDGET}",
            param="thinking.budget_tokens",
        )
    return budget


# Anthropic's effort levels as the template's (gpt-oss knows low, medium and high).
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


def _read_effort(body: Body) -> dict[str, JsonValue]:
    config = body.get("output_config")
    effort = as_object(config, "output_config").get("effort") if config is not None else None
    if effort is None:
        return {}
    if effort not in _EFFORTS:
        raise invalid(
            f"output_config.effort: must be one of {', '.join(repr(e) for e in _EFFORTS)}", param="output_config.effort"
        )
    return {"reasoning_effort": _EFFORTS[str(effort)]}


def _omits_thinking(body: Body) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("display") == "omitted"


def _read_thinking(body: Body) -> dict[str, JsonValue]:
    raw = body.get("thinking")
    if raw is None:
        return {}
    thinking = as_object(raw, "thinking")
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise invalid("thinking.type: must be 'enabled', 'disabled' or 'adaptive'", param="thinking.type")
    # `display` only changes what is shown of the thinking; this server shows it as generated.
    if thinking.get("display", "summarized") not in _DISPLAYS:
        raise invalid("thinking.display: must be 'summarized' or 'omitted'", param="thinking.display")
    # mlx-lm maps enable_thinking onto whatever switch the template has.
    return {"enable_thinking": kind != "disabled"}
