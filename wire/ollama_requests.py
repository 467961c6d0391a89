"""Ollama's `/api/chat` and `/api/generate` bodies → internal requests.

Pure functions over decoded JSON (docs/STYLE.md, "Pure wire"). Sampling comes in `options`, spelled as
Ollama spells it (`num_predict`, `repeat_penalty`); an option that changes output and that this server
cannot honour (`mirostat`, `tfs_z`, ...) is a 400 naming it (`options.mirostat`), one that cannot change
output (`num_gpu`, `num_thread`, ...) is accepted, and an unknown one is refused. `images` are base64
strings, read as the other APIs' image parts are. `keep_alive` and `num_ctx` are the route's to apply
(edge/ollama_routes.py); here they are only read and checked.
"""

from __future__ import annotations

import math
import re

from pipeline.errors import invalid, quote, unsupported
from pipeline.requests import (
    ChatRequest,
    Constraint,
    ConstraintKind,
    GenerationParams,
    ImagePart,
    JsonObject,
    JsonValue,
    Message,
    Role,
    Sampling,
    TextRequest,
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
    read_object,
    read_stops,
    read_str,
)
from wire.image_parts import image_from_base64
from wire.openai_requests import SEED_MAX, SEED_MIN, read_call_records, read_function_tools

_ROLES = {role.value: role for role in (Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL)}
# Options that only place the model on the hardware: they cannot change a token.
_INERT_OPTIONS = frozenset(
    {"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "use_mmap", "use_mlock", "num_thread"}
    | {"vocab_only", "logits_all", "embedding_only", "num_keep"}
)
_HONOURED_OPTIONS = frozenset(
    {"temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "num_predict", "stop", "num_ctx"}
    | {"repeat_penalty", "presence_penalty", "frequency_penalty"}
)
# Options this server has no sampler for, and the value at which each changes nothing.
_NEUTRAL_OPTIONS: dict[str, JsonValue] = {"mirostat": 0, "tfs_z": 1.0, "penalize_newline": False}
_THINK_LEVELS = ("low", "medium", "high")
_ANY_OBJECT: JsonValue = {"type": "object"}
# Pipeline spellings `fleet/defaults.py` reads off a body to tell a client's value from a default.
DEFAULTED = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
    "num_predict": "max_tokens",
}


def decode_ollama_chat(value: JsonValue) -> ChatRequest:
    body = as_body(value)
    tools = read_function_tools(body)
    items = as_list(body.get("messages") if body.get("messages") is not None else [], "messages")
    messages = tuple(_read_message(item, f"messages[{index}]") for index, item in enumerate(items))
    if not messages:
        raise invalid("'messages' must hold at least one message", param="messages")
    return ChatRequest(
        messages=messages,
        params=read_params(body),
        template_kwargs=_read_think(body),
        tools=tools,
        stream=read_bool(body, "stream") is not False,
        include_usage=True,
        model=read_str(body, "model"),
    )


def decode_ollama_generate(value: JsonValue) -> ChatRequest | TextRequest:
    """A prompt rendered as one user turn with the model's template (after `system`), or sent as it is with `raw`
    or a `suffix` (fill-in-the-middle)."""
    body = as_body(value)
    if body.get("context") is not None:
        raise unsupported("context")
    if read_str(body, "template"):
        raise unsupported("template")
    prompt = read_str(body, "prompt") or ""
    suffix = read_str(body, "suffix") or None
    stream = read_bool(body, "stream") is not False
    images = _read_images(body.get("images"), "images")
    if read_bool(body, "raw") or suffix is not None:
        for key in ("system", "images", "think"):
            if body.get(key):
                raise invalid(f"'{key}' needs the model's template: not with 'raw' or 'suffix'", param=key)
        params = read_params(body)
        return TextRequest(prompt=prompt, suffix=suffix, params=params, stream=stream, model=read_str(body, "model"))
    system = read_str(body, "system")
    turns = (Message(role=Role.SYSTEM, content=system),) if system else ()
    return ChatRequest(
        messages=(*turns, Message(role=Role.USER, content=prompt, images=images)),
        params=read_params(body),
        template_kwargs=_read_think(body),
        stream=stream,
        include_usage=True,
        model=read_str(body, "model"),
    )


def is_load_only(value: JsonValue) -> bool:
    """A generate body with no prompt: Ollama's way to load (or, with `keep_alive: 0`, unload) a model."""
    return isinstance(value, dict) and not value.get("prompt") and not value.get("suffix") and not value.get("images")


def read_params(body: Body) -> GenerationParams:
    options = _options(body)
    _check_hoisted(body, options)
    if read_bool(body, "logprobs") or body.get("top_logprobs"):
        raise unsupported("logprobs")
    predict = _option_int(options, "num_predict", minimum=-2)
    limit = _option_int(options, "num_ctx", minimum=1)
    max_tokens = predict if predict is not None and predict > 0 else None
    if limit is not None:
        max_tokens = min(max_tokens or limit, limit)
    return GenerationParams(
        max_tokens=max_tokens,
        # Cut to what the window leaves, as Ollama's own -1 ("until the context is full") is.
        clamp_max_tokens=True,
        context_limit=limit,
        sampling=_read_sampling(options),
        stop=read_stops(options.get("options.stop"), "options.stop", allow_string=True),
        constraint=_read_format(body.get("format")),
    )


def num_ctx(body: Body) -> int | None:
    """The context limit `options.num_ctx` asks for: the prompt must fit in it (the route checks it)."""
    return _option_int(_options(body), "num_ctx", minimum=1)


def defaults_view(body: JsonObject) -> JsonObject:
    """The body with each sampling option also at the top level under the pipeline's spelling, so the per-model
    defaults (fleet/defaults.py, which read the top level) fill only what the client left unset."""
    raw = body.get("options")
    options = raw if isinstance(raw, dict) else {}
    hoisted = {ours: options[theirs] for theirs, ours in DEFAULTED.items() if options.get(theirs) is not None}
    if "max_tokens" in hoisted and not (isinstance(hoisted["max_tokens"], int) and hoisted["max_tokens"] > 0):
        del hoisted["max_tokens"]  # -1 and -2: no limit of the client's, so the model's default applies
    return {**body, **hoisted}


def _check_hoisted(body: Body, options: Body) -> None:
    """The top-level copies `defaults_view` made agree with `options`; a client's own top-level sampling field
    (not Ollama's) is refused rather than ignored."""
    for theirs, ours in DEFAULTED.items():
        top = body.get(ours)
        if top is not None and top != options.get(f"options.{theirs}"):
            raise invalid(f"'{ours}' is not an Ollama field: send 'options.{theirs}'", param=ours)


def _options(body: Body) -> dict[str, JsonValue]:
    """`options` keyed as the client's 400s name them (`options.top_k`), each name checked."""
    options = read_object(body, "options") or {}
    for key, value in options.items():
        if key in _NEUTRAL_OPTIONS:
            if value is not None and value != _NEUTRAL_OPTIONS[key]:
                raise unsupported(f"options.{key}")
        elif key not in _INERT_OPTIONS and key not in _HONOURED_OPTIONS and key not in ("mirostat_tau", "mirostat_eta"):
            if key == "repeat_last_n":
                raise unsupported("options.repeat_last_n")
            raise invalid(f"'options.{key}' is not an Ollama option this server knows", param=f"options.{key}")
    return {f"options.{key}": value for key, value in options.items()}


def _option_int(options: Body, key: str, *, minimum: int) -> int | None:
    return read_int(options, f"options.{key}", minimum=minimum)


def _read_sampling(options: Body) -> Sampling:
    def number(key: str, low: float, high: float) -> float | None:
        return read_number(options, f"options.{key}", minimum=low, maximum=high)

    top_k = _option_int(options, "top_k", minimum=0)
    return Sampling(
        temperature=_or(number("temperature", 0, 2), 1.0),
        top_p=_or(number("top_p", 0, 1), 1.0),
        top_k=top_k or 0,
        min_p=_or(number("min_p", 0, 1), 0.0),
        typical_p=_or(number("typical_p", 0, 1), 1.0) or 1.0,
        seed=read_int(options, "options.seed", minimum=SEED_MIN, maximum=SEED_MAX),
        repetition_penalty=_penalty(number("repeat_penalty", 0, 10)),
        presence_penalty=number("presence_penalty", -2, 2),
        frequency_penalty=number("frequency_penalty", -2, 2),
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _penalty(value: float | None) -> float | None:
    # 0 is llama.cpp's "off", as 1 is; a penalty of 0 would divide by zero.
    return None if value is None or value == 0 else value


def _read_format(value: JsonValue) -> Constraint | None:
    if value is None or value == "":
        return None
    if value == "json":
        return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=_ANY_OBJECT, param="format")
    if isinstance(value, dict):
        return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=value, param="format")
    raise invalid(f"'format' must be \"json\" or a JSON schema object, got {quote(value)}", param="format")


def _read_think(body: Body) -> dict[str, JsonValue]:
    think = body.get("think")
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think in _THINK_LEVELS:
        return effort_kwargs(as_str(think, "think"))
    raise invalid(f"'think' must be a boolean or one of {list(_THINK_LEVELS)}, got {quote(think)}", param="think")


def _read_message(value: JsonValue, param: str) -> Message:
    item = as_object(value, param)
    role_name = as_str(item.get("role"), f"{param}.role")
    role = _ROLES.get(role_name)
    if role is None:
        raise invalid(f"'{param}.role' must be one of {sorted(_ROLES)}, got {quote(role_name)}", param=f"{param}.role")
    content = read_str(item, "content", param=f"{param}.content") or ""
    return Message(
        role=role,
        content=content,
        name=read_str(item, "tool_name", param=f"{param}.tool_name"),
        tool_call_id=read_str(item, "tool_call_id", param=f"{param}.tool_call_id"),
        tool_calls=read_call_records(item.get("tool_calls"), f"{param}.tool_calls"),
        reasoning=read_str(item, "thinking", param=f"{param}.thinking") or None,
        images=_read_images(item.get("images"), f"{param}.images"),
    )


def _read_images(value: JsonValue, param: str) -> tuple[ImagePart, ...]:
    # Ollama places a message's images before its text.
    images = as_list(value, param) if value is not None else []
    return tuple(
        image_from_base64(as_str(item, f"{param}[{index}]"), None, param=f"{param}[{index}]", offset=0)
        for index, item in enumerate(images)
    )


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def read_keep_alive(body: Body) -> float | None:
    """`keep_alive` in seconds: 0 unloads after the request, `math.inf` (any negative) keeps the model loaded;
    None: not given. A number is seconds; a string is a Go duration (`"5m"`, `"1h30m"`) or a number of seconds."""
    value = body.get("keep_alive")
    if value is None:
        return None
    seconds = _seconds(value)
    if seconds is None:
        message = f"'keep_alive' must be a number of seconds or a duration such as \"5m\", got {quote(value)}"
        raise invalid(message, param="keep_alive")
    return math.inf if seconds < 0 else seconds


def _seconds(value: JsonValue) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    text = text.lstrip("+-")
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sign * sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
