"""OpenAI Chat Completions and Completions requests → internal requests.

Pure functions over decoded JSON (docs/STYLE.md, "Pure wire"). A field that would change the
output but is not implemented is refused by name (`unsupported`), never
dropped; fields that cannot change the output (`user`, `metadata`,
`store`, `service_tier`) are accepted and ignored.
`prompt_cache_key` / `session_id` only steer the prompt cache.
"""

from __future__ import annotations

from pipeline.errors import invalid, quote, unsupported
from pipeline.requests import (
    ChatRequest,
    GenerationParams,
    ImagePart,
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
from wire.field_reads import (
    Body,
    as_body,
    as_list,
    as_object,
    as_str,
    effort_kwargs,
    named_tool,
    read_arguments,
    read_bool,
    read_function,
    read_int,
    read_number,
    read_object,
    read_stops,
    read_str,
)
from wire.image_parts import image_from_url
from wire.openai_extensions import (
    read_ignore_eos,
    read_min_tokens,
    read_stop_token_ids,
    read_typical_p,
    refuse_extensions,
)
from wire.structured import openai_constraint

_ROLES = {role.value: role for role in Role}
_MAX_TOP_LOGPROBS = 20
# A seed is 64 bits, signed or not: the sampler keys its generator with seed mod 2**64.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})


def decode_chat(value: JsonValue) -> ChatRequest:
    body = as_body(value)
    _refuse_unsupported(body)
    _refuse_chat_only(body)
    continue_final = read_bool(body, "continue_final_message") is True
    stream, include_usage = _read_stream(body)
    kwargs = dict(read_object(body, "chat_template_kwargs") or {})
    effort = read_str(body, "reasoning_effort")
    if effort is not None:
        _check_effort(effort)
        for key, value in effort_kwargs(effort).items():
            kwargs.setdefault(key, value)
    tools = read_function_tools(body)
    messages = _read_messages(body)
    if continue_final and messages[-1].role is not Role.ASSISTANT:
        raise invalid(
            "'continue_final_message' needs the last message to be the assistant's", param="continue_final_message"
        )
    return ChatRequest(
        messages=messages,
        params=_read_params(
            body, max_tokens_keys=("max_completion_tokens", "max_tokens"), logprobs=_chat_logprobs(body)
        ),
        template_kwargs=kwargs,
        tools=tools,
        tool_choice=_read_tool_choice(body, tools),
        parallel_tool_calls=read_bool(body, "parallel_tool_calls") is not False,
        # vLLM's extension: the answer continues the last (assistant) message.
        continue_final=continue_final,
        stream=stream,
        include_usage=include_usage,
    )


def decode_completion(value: JsonValue) -> TextRequest:
    body = as_body(value)
    _refuse_unsupported(body)
    if read_bool(body, "echo"):
        raise unsupported("echo")
    for key in ("multi_modal_data", "images", "image_url"):
        if body.get(key) is not None:
            raise invalid(f"'{key}': Completions take text only; send images to /v1/chat/completions", param=key)
    if read_bool(body, "continue_final_message"):
        raise unsupported("continue_final_message")
    if (read_int(body, "best_of", minimum=1) or 1) > 1:
        raise unsupported("best_of")
    stream, include_usage = _read_stream(body)
    return TextRequest(
        prompt=_read_prompt(body),
        # Fill-in-the-middle; whether the model can is known once it is loaded.
        suffix=read_str(body, "suffix") or None,
        params=_read_params(
            body,
            max_tokens_keys=("max_tokens",),
            default_max_tokens=16,
            logprobs=read_int(body, "logprobs", minimum=0, maximum=_MAX_TOP_LOGPROBS),
        ),
        stream=stream,
        include_usage=include_usage,
    )


def _refuse_unsupported(body: Body) -> None:
    if (read_int(body, "n", minimum=1) or 1) > 1:
        raise unsupported("n")
    refuse_extensions(body)


def _refuse_chat_only(body: Body) -> None:
    for key in ("functions", "function_call", "prediction", "audio", "web_search_options"):
        if body.get(key) is not None:
            raise unsupported(key)
    modalities = body.get("modalities")
    if modalities is not None and as_list(modalities, "modalities") != ["text"]:
        raise unsupported("modalities")


def _read_stream(body: Body) -> tuple[bool, bool]:
    stream = bool(read_bool(body, "stream"))
    options = read_object(body, "stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise invalid("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise invalid("'stream_options.include_usage' must be a boolean", param="stream_options.include_usage")
    return stream, include_usage


def _read_messages(body: Body) -> tuple[Message, ...]:
    raw = body.get("messages")
    if raw is None:
        raise invalid("'messages' is required", param="messages")
    items = as_list(raw, "messages")
    if not items:
        raise invalid("'messages' must contain at least one message", param="messages")
    return tuple(_read_message(item, f"messages[{index}]") for index, item in enumerate(items))


def _read_message(value: JsonValue, param: str) -> Message:
    item = as_object(value, param)
    role_name = as_str(item.get("role"), f"{param}.role")
    role = _ROLES.get(role_name)
    if role is None:
        raise invalid(f"'{param}.role' must be one of {sorted(_ROLES)}, got {quote(role_name)}", param=f"{param}.role")
    content, images = _read_content(item.get("content"), f"{param}.content", allow_null=role is Role.ASSISTANT)
    reasoning = read_str(item, "reasoning_content", param=f"{param}.reasoning_content")
    return Message(
        role=role,
        content=content,
        name=read_str(item, "name", param=f"{param}.name"),
        tool_call_id=read_str(item, "tool_call_id", param=f"{param}.tool_call_id"),
        tool_calls=read_call_records(item.get("tool_calls"), f"{param}.tool_calls"),
        reasoning=reasoning if reasoning is not None else read_str(item, "reasoning", param=f"{param}.reasoning"),
        images=images,
    )


def read_call_records(value: JsonValue, param: str) -> tuple[ToolCallRecord, ...]:
    """A message's `tool_calls` (OpenAI's, and Ollama's whose arguments are an object) as call records."""
    if value is None:
        return ()
    calls = []
    for index, raw in enumerate(as_list(value, param)):
        call = as_object(raw, f"{param}[{index}]")
        function = as_object(call.get("function"), f"{param}[{index}].function")
        arguments = read_arguments(function.get("arguments", "{}"), f"{param}[{index}].function.arguments")
        calls.append(
            ToolCallRecord(
                id=read_str(call, "id", param=f"{param}[{index}].id") or f"call_{index}",
                name=as_str(function.get("name"), f"{param}[{index}].function.name"),
                arguments=arguments,
            )
        )
    return tuple(calls)


def read_function_tools(body: Body) -> tuple[Tool, ...]:
    """`tools` as OpenAI Chat (and Ollama) write them: `{"type": "function", "function": {...}}`."""
    raw = body.get("tools")
    if raw is None:
        return ()
    tools = []
    for index, value in enumerate(as_list(raw, "tools")):
        param = f"tools[{index}]"
        item = as_object(value, param)
        if item.get("type", "function") != "function":
            raise unsupported(f"{param}.type")
        function = as_object(item.get("function"), f"{param}.function")
        tools.append(read_function(function, f"{param}.function", schema_key="parameters"))
    return tuple(tools)


def _read_tool_choice(body: Body, tools: tuple[Tool, ...]) -> ToolChoice:
    raw = body.get("tool_choice")
    if raw is None or raw == "auto":
        return ToolChoice()
    if raw == "none":
        return ToolChoice(mode=ToolChoiceMode.NONE)
    if not tools and raw != "none":
        raise invalid("'tool_choice' needs 'tools'", param="tool_choice")
    if raw == "required":
        return ToolChoice(mode=ToolChoiceMode.REQUIRED)
    if isinstance(raw, dict):
        function = as_object(raw.get("function"), "tool_choice.function")
        return named_tool(function.get("name"), tools, "tool_choice.function.name")
    raise invalid("'tool_choice' must be 'none', 'auto', 'required' or a function", param="tool_choice")


def _check_effort(effort: str) -> None:
    if effort not in _EFFORTS:
        raise invalid(f"'reasoning_effort' must be one of {sorted(_EFFORTS)}", param="reasoning_effort")


def _read_content(value: JsonValue, param: str, *, allow_null: bool) -> tuple[str, tuple[ImagePart, ...]]:
    if value is None and allow_null:
        return "", ()
    if isinstance(value, str):
        return value, ()
    parts = as_list(value, param) if value is not None else None
    if parts is None:
        raise invalid(f"'{param}' is required", param=param)
    texts: list[str] = []
    images: list[ImagePart] = []
    offset = 0
    for index, part in enumerate(parts):
        part_param = f"{param}[{index}]"
        item = as_object(part, part_param)
        kind = item.get("type")
        if kind == "image_url":
            image = as_object(item.get("image_url"), f"{part_param}.image_url")
            url = as_str(image.get("url"), f"{part_param}.image_url.url")
            images.append(image_from_url(url, param=part_param, offset=offset, detail=read_str(image, "detail")))
            continue
        if kind not in ("text", "input_text"):
            message = f"'{part_param}.type' {quote(kind)} is not supported; only text and image_url parts are"
            raise invalid(message, param=f"{part_param}.type")
        texts.append(as_str(item.get("text"), f"{part_param}.text"))
        offset += len(texts[-1])
    return "".join(texts), tuple(images)


def _read_prompt(body: Body) -> str | tuple[int, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(int(t) for t in prompt if isinstance(t, int))
    if isinstance(prompt, list) and len(prompt) > 1:
        raise unsupported("prompt")  # several prompts in one request: a batch
    raise invalid("'prompt' must be a string or a non-empty array of token ids", param="prompt")


def _chat_logprobs(body: Body) -> int | None:
    """Chat asks with `logprobs: true` and counts alternatives in `top_logprobs`."""
    top = read_int(body, "top_logprobs", minimum=0, maximum=_MAX_TOP_LOGPROBS)
    if not read_bool(body, "logprobs"):
        if top is not None:
            raise invalid("'top_logprobs' needs 'logprobs' to be true", param="top_logprobs")
        return None
    return top or 0


def _read_params(
    body: Body, *, max_tokens_keys: tuple[str, ...], default_max_tokens: int | None = None, logprobs: int | None = None
) -> GenerationParams:
    # Every spelling is validated; the first one present wins.
    given = [value for value in (read_int(body, key, minimum=1) for key in max_tokens_keys) if value is not None]
    max_tokens = given[0] if given else default_max_tokens
    return GenerationParams(
        max_tokens=max_tokens,
        sampling=_read_sampling(body),
        stop=read_stops(body.get("stop"), "stop", allow_string=True),
        cache_key=read_cache_key(body),
        constraint=openai_constraint(body),
        logprobs=logprobs,
        min_tokens=read_min_tokens(body),
        ignore_eos=read_ignore_eos(body),
        stop_token_ids=read_stop_token_ids(body),
        skip_special_tokens=read_bool(body, "skip_special_tokens") is not False,
    )


def read_cache_key(body: Body) -> str | None:
    """OpenAI's `prompt_cache_key`, or the `session_id` other clients send, for session affinity."""
    return read_str(body, "prompt_cache_key") or read_str(body, "session_id") or None


def _read_sampling(body: Body) -> Sampling:
    top_k = read_int(body, "top_k", minimum=-1)
    return Sampling(
        temperature=_default(read_number(body, "temperature", minimum=0, maximum=2), 1.0),
        top_p=_default(read_number(body, "top_p", minimum=0, maximum=1), 1.0),
        top_k=0 if top_k is None or top_k < 0 else top_k,
        min_p=_default(read_number(body, "min_p", minimum=0, maximum=1), 0.0),
        seed=read_int(body, "seed", minimum=SEED_MIN, maximum=SEED_MAX),
        presence_penalty=read_number(body, "presence_penalty", minimum=-2, maximum=2),
        frequency_penalty=read_number(body, "frequency_penalty", minimum=-2, maximum=2),
        repetition_penalty=read_number(body, "repetition_penalty", minimum=0.01, maximum=10),
        logit_bias=_read_logit_bias(body),
        typical_p=read_typical_p(body),
    )


def _default(value: float | None, default: float) -> float:
    return default if value is None else value


def _read_logit_bias(body: Body) -> dict[int, float]:
    raw = read_object(body, "logit_bias") or {}
    bias = {}
    for key, value in raw.items():
        if not key.lstrip("-").isdigit() or int(key) < 0:
            raise invalid(f"'logit_bias' keys must be token ids, got {quote(key)}", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise invalid(f"'logit_bias[{key}]' must be a number in [-100, 100]", param="logit_bias")
        bias[int(key)] = float(value)
    return bias
