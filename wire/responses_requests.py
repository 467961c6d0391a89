"""OpenAI Responses requests → internal chat requests.

Decoding is two steps, both pure (docs/STYLE.md, "Pure wire"): `decode_responses` validates a
body into `ResponsesRequest` (everything a 400 can be about, before any
store lookup), and `to_chat` turns it — with the stored history that
`previous_response_id` names spliced in front — into a `ChatRequest`.
Input items are kept as the client sent them, so a stored conversation
replays through the same decoder. Tools are read by `wire.responses_tools`
(custom and namespace tools offered, hosted ones skipped); fields that
would change the output and are not served are refused by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

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
)
from wire.field_reads import (
    Body,
    as_body,
    as_list,
    as_object,
    as_str,
    effort_kwargs,
    read_bool,
    read_int,
    read_number,
    read_str,
)
from wire.image_parts import image_from_url
from wire.responses_mcp import McpChoice, McpServer, call_result_text, echoed_tool, read_mcp_choice, read_mcp_servers
from wire.responses_tools import ResponsesTools, ToolSpec, call_arguments, qualified, read_tool_choice, read_tools
from wire.structured import responses_constraint

_RESPONSE_ID = re.compile(r"^resp_[A-Za-z0-9_-]{1,128}$")
_ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM, "developer": Role.DEVELOPER}
_TEXT_PARTS = ("input_text", "output_text", "text")
# Items the model does not read: earlier reasoning (chat templates drop it too), and MCP bookkeeping
# (listings, approvals; edge/mcp_loop.py acts on them).
_UNSEEN = ("reasoning", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response")


@attrs.frozen(kw_only=True)
class ResponsesRequest:
    """A validated Responses body; `input` holds the client's items as sent."""

    input: tuple[JsonObject, ...]
    instructions: str | None
    previous_response_id: str | None
    params: GenerationParams
    tools: tuple[Tool, ...]
    tool_choice: ToolChoice
    template_kwargs: JsonObject
    parallel_tool_calls: bool
    store: bool
    stream: bool
    # `truncation: "auto"`: drop the oldest exchanges of a conversation past the window instead of a 400.
    truncate: bool
    # Fields the response object echoes back.
    echo: JsonObject
    # What each offered tool name is in the client's terms (custom, namespaced).
    tool_specs: Mapping[str, ToolSpec] = attrs.field(factory=dict)
    # Hosted tools the request listed, which the model is not offered.
    skipped_tools: tuple[str, ...] = ()
    # A forced custom tool whose grammar holds the whole output: the output is its input.
    grammar_call: str | None = None
    # Remote MCP servers the edge lists and calls (wire/responses_mcp.py), the one forced, the bound on calls.
    mcp_servers: tuple[McpServer, ...] = ()
    mcp_choice: McpChoice | None = None
    max_tool_calls: int | None = None
    # Runs after the request has been answered (edge/background.py); only with `store`.
    background: bool = False


def decode_responses(value: JsonValue) -> ResponsesRequest:
    body = as_body(value)
    _refuse_unserved(body)
    items = _read_input(body)
    # Validate the items now: a bad item is a 400 before any store lookup.
    _to_messages(items)
    tools = read_tools(body.get("tools"))
    mcp_servers = read_mcp_servers(body.get("tools"))
    choice = read_tool_choice(body.get("tool_choice"), tools, mcp=bool(mcp_servers))
    constraint = responses_constraint(body)
    if choice.grammar_call is not None:
        # The forced call's input is the whole output; a text format governs text, and there is none.
        grammar = tools.specs[choice.grammar_call].grammar
        constraint = None if grammar is None else attrs.evolve(grammar, whole_output=True)
    max_tokens = read_int(body, "max_output_tokens", minimum=1)
    truncation = body.get("truncation") or "disabled"
    if truncation not in ("auto", "disabled"):
        raise invalid("'truncation' must be 'auto' or 'disabled'", param="truncation")
    temperature = read_number(body, "temperature", minimum=0, maximum=2)
    top_p = read_number(body, "top_p", minimum=0, maximum=1)
    user = read_str(body, "user")
    max_tool_calls = read_int(body, "max_tool_calls", minimum=1)
    return ResponsesRequest(
        input=items,
        instructions=read_str(body, "instructions"),
        previous_response_id=_read_previous_id(body),
        params=GenerationParams(
            max_tokens=max_tokens,
            sampling=Sampling(
                temperature=1.0 if temperature is None else temperature, top_p=1.0 if top_p is None else top_p
            ),
            constraint=constraint,
        ),
        tools=tools.tools,
        tool_choice=choice.choice,
        template_kwargs=_read_reasoning(body),
        parallel_tool_calls=read_bool(body, "parallel_tool_calls") is not False,
        store=read_bool(body, "store") is not False,
        stream=bool(read_bool(body, "stream")),
        background=bool(read_bool(body, "background")),
        truncate=truncation == "auto",
        echo={
            "max_output_tokens": max_tokens,
            "max_tool_calls": max_tool_calls,
            "temperature": temperature,
            "top_p": top_p,
            "metadata": read_object_or_empty(body, "metadata"),
            "parallel_tool_calls": read_bool(body, "parallel_tool_calls") is not False,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": _echo_tools(body, tools),
            "truncation": truncation,
            # Left out when unset: the schema has it a string.
            **({} if user is None else {"user": user}),
            "text": {"format": _format_echo(body)},
            "reasoning": {"effort": _effort(body), "summary": None},
        },
        tool_specs=tools.specs,
        skipped_tools=tools.skipped,
        grammar_call=choice.grammar_call,
        mcp_servers=mcp_servers,
        mcp_choice=read_mcp_choice(body.get("tool_choice")) if mcp_servers else None,
        max_tool_calls=max_tool_calls,
    )


def to_chat(request: ResponsesRequest, history: Sequence[JsonObject], instructions: str | None) -> ChatRequest:
    """The chat request for `request`, continuing `history` (earlier input and output items).

    `instructions` are the effective ones: the request's, else the stored
    conversation's.
    """
    system = (Message(role=Role.SYSTEM, content=instructions),) if instructions else ()
    return ChatRequest(
        messages=system + _to_messages((*history, *request.input)),
        params=request.params,
        template_kwargs=request.template_kwargs,
        tools=request.tools,
        tool_choice=request.tool_choice,
        parallel_tool_calls=request.parallel_tool_calls,
        stream=request.stream,
        truncate_to_fit=request.truncate,
    )


def read_object_or_empty(body: Body, key: str) -> JsonValue:
    value = body.get(key)
    return {} if value is None else as_object(value, key)


def _read_input(body: Body) -> tuple[JsonObject, ...]:
    raw = body.get("input")
    if raw is None:
        raise invalid("Missing required parameter: 'input'.", param="input")
    if isinstance(raw, str):
        return ({"type": "message", "role": "user", "content": raw},)
    items = tuple(as_object(item, f"input[{i}]") for i, item in enumerate(as_list(raw, "input")))
    if not items:
        raise invalid("'input' must not be empty", param="input")
    return items


def _read_previous_id(body: Body) -> str | None:
    value = read_str(body, "previous_response_id")
    if value is not None and not _RESPONSE_ID.match(value):
        raise invalid(
            f"Invalid 'previous_response_id': {quote(value)} is not a response id.", param="previous_response_id"
        )
    return value


def _to_messages(items: Sequence[JsonObject]) -> tuple[Message, ...]:
    messages: list[Message] = []
    for index, item in enumerate(items):
        param = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, param))
        elif kind in ("function_call", "custom_tool_call"):
            _add_call(messages, item, param)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            text = output if isinstance(output, str) else _text_parts(output, f"{param}.output")
            messages.append(
                Message(role=Role.TOOL, content=text, tool_call_id=as_str(item.get("call_id"), f"{param}.call_id"))
            )
        elif kind == "mcp_call":
            _add_call(messages, {**item, "call_id": as_str(item.get("id"), f"{param}.id")}, param)
            messages.append(Message(role=Role.TOOL, content=call_result_text(item), tool_call_id=str(item["id"])))
        elif kind not in _UNSEEN:
            raise invalid(f"Invalid '{param}.type': {quote(kind)} items are not supported.", param=f"{param}.type")
    return tuple(messages)


def _message(item: JsonObject, param: str) -> Message:
    role_name = as_str(item.get("role"), f"{param}.role")
    role = _ROLES.get(role_name)
    if role is None:
        raise invalid(f"Invalid '{param}.role': {quote(role_name)}.", param=f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        return Message(role=role, content=content)
    text, images = _parts(content, f"{param}.content")
    return Message(role=role, content=text, images=images)


def _text_parts(value: JsonValue, param: str) -> str:
    text, images = _parts(value, param)
    if images:
        raise invalid(f"Invalid '{images[0].param}': images are not allowed here.", param=images[0].param)
    return text


def _parts(value: JsonValue, param: str) -> tuple[str, tuple[ImagePart, ...]]:
    texts: list[str] = []
    images: list[ImagePart] = []
    for index, raw in enumerate(as_list(value, param)):
        where = f"{param}[{index}]"
        part = as_object(raw, where)
        if part.get("type") == "input_image":
            images.append(_input_image(part, where, offset=sum(map(len, texts))))
            continue
        if part.get("type") not in _TEXT_PARTS:
            raise invalid(
                f"Invalid '{where}.type': {quote(part.get('type'))} is not supported; text and input_image parts are.",
                param=f"{where}.type",
            )
        texts.append(as_str(part.get("text"), f"{where}.text"))
    return "".join(texts), tuple(images)


def _input_image(part: JsonObject, where: str, *, offset: int) -> ImagePart:
    if part.get("file_id") is not None:
        raise invalid(
            f"Invalid '{where}.file_id': uploaded files are not supported; send 'image_url'.",
            param=f"{where}.file_id",
            code="unsupported_parameter",
        )
    url = as_str(part.get("image_url"), f"{where}.image_url")
    return image_from_url(url, param=where, offset=offset, detail=read_str(part, "detail", param=f"{where}.detail"))


def _add_call(messages: list[Message], item: JsonObject, param: str) -> None:
    name = as_str(item.get("name"), f"{param}.name")
    call = ToolCallRecord(
        id=as_str(item.get("call_id"), f"{param}.call_id"),
        name=qualified(name, read_str(item, "namespace", param=f"{param}.namespace")),
        arguments=call_arguments(item, param),
    )
    last = messages[-1] if messages else None
    # Calls right after an assistant message are that turn's calls.
    if last is not None and last.role is Role.ASSISTANT:
        messages[-1] = attrs.evolve(last, tool_calls=(*last.tool_calls, call))
    else:
        messages.append(Message(role=Role.ASSISTANT, content="", tool_calls=(call,)))


def _echo_tools(body: Body, tools: ResponsesTools) -> JsonValue:
    """The tools as the client sent them; function tools in their full shape."""
    echoed: list[JsonValue] = []
    for value in as_list(body.get("tools") or [], "tools"):
        item = as_object(value, "tools")
        if item.get("type") == "function":
            tool = next(t for t in tools.tools if t.name == item.get("name"))
            echoed.append(
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": tool.strict,
                }
            )
        else:
            echoed.append(echoed_tool(item) if item.get("type") == "mcp" else item)
    return echoed


def _refuse_unserved(body: Body) -> None:
    """Fields that would change the output; their neutral values are fine."""
    if read_bool(body, "background") and read_bool(body, "store") is False:
        # OpenAI's own refusal: a background response is read back from the store.
        raise invalid("Background responses require 'store' to be true", param="background")
    if read_int(body, "top_logprobs", minimum=0, maximum=20):
        raise unsupported("top_logprobs")
    for key in ("conversation", "prompt"):
        if body.get(key) is not None:
            raise unsupported(key)


def _format_echo(body: Body) -> JsonValue:
    text = body.get("text")
    format_ = text.get("format") if isinstance(text, dict) else None
    return format_ if isinstance(format_, dict) else {"type": "text"}


def _effort(body: Body) -> JsonValue:
    reasoning = body.get("reasoning")
    return reasoning.get("effort") if isinstance(reasoning, dict) else None


def _read_reasoning(body: Body) -> JsonObject:
    raw = body.get("reasoning")
    if raw is None:
        return {}
    effort = as_object(raw, "reasoning").get("effort")
    if effort is None:
        return {}
    if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
        raise invalid(f"Invalid 'reasoning.effort': {quote(effort)}.", param="reasoning.effort")
    return effort_kwargs(effort)


def continued_input(stored_input: Sequence[JsonValue], stored_output: Sequence[JsonValue]) -> tuple[JsonObject, ...]:
    """What a follow-up replays: the stored response's input, then its output as input items."""
    return tuple(item for item in (*stored_input, *stored_output) if isinstance(item, dict))
