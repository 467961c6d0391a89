"""Typed reads of JSON request fields; each failure names its parameter.

Every decoder in `wire/` reads fields through these helpers, so a wrong
type or range is always a 400 whose `param` says which field, spelled as
the client sent it (`messages[2].content`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from pipeline.errors import excerpt, invalid, quote
from pipeline.jsontext import MAX_DEPTH, LoneSurrogate, TooDeep, loads
from pipeline.requests import JsonObject, JsonValue, Tool, ToolChoice, ToolChoiceMode

Body = Mapping[str, JsonValue]


def as_body(value: JsonValue) -> JsonObject:
    """The request body: an object, whose `model` (every API has one) is a string when given."""
    if not isinstance(value, dict):
        raise invalid(f"The request body must be a JSON object, got {_json_type(value)}")
    read_str(value, "model")
    return value


def _json_type(value: JsonValue) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def as_object(value: JsonValue, param: str) -> JsonObject:
    if not isinstance(value, dict):
        raise invalid(f"'{param}' must be a JSON object", param=param)
    return value


def as_list(value: JsonValue, param: str) -> list[JsonValue]:
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be an array", param=param)
    return value


def as_str(value: JsonValue, param: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"'{param}' must be a string", param=param)
    return value


def read_str(body: Body, key: str, *, param: str | None = None) -> str | None:
    value = body.get(key)
    return None if value is None else as_str(value, param or key)


def read_bool(body: Body, key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid(f"'{key}' must be a boolean", param=key)
    return value


def read_int(body: Body, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{key}' must be an integer", param=key)
    _check_range(key, value, minimum, maximum)
    return value


def read_number(body: Body, key: str, *, minimum: float | None = None, maximum: float | None = None) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"'{key}' must be a number", param=key)
    if not math.isfinite(value):
        raise invalid(f"'{key}' must be a finite number", param=key)
    _check_range(key, value, minimum, maximum)
    return float(value)


def read_object(body: Body, key: str) -> JsonObject | None:
    value = body.get(key)
    return None if value is None else as_object(value, key)


def _check_range(key: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise invalid(f"'{key}' must be >= {minimum}, got {_quoted(value)}", param=key)
    if maximum is not None and value > maximum:
        raise invalid(f"'{key}' must be <= {maximum}, got {_quoted(value)}", param=key)


def _quoted(value: float) -> str:
    # An integer of thousands of digits is the client's to keep.
    return (
        excerpt(repr(value), 40)
        if isinstance(value, float) or abs(value) < 10**40
        else "an integer of more than 40 digits"
    )


def read_function(item: Body, param: str, *, schema_key: str) -> Tool:
    """A function tool: `name`, optional `description`, and a JSON Schema object.

    OpenAI calls the schema `parameters`, Anthropic `input_schema`.
    """
    name = as_str(item.get("name"), f"{param}.name")
    if not name:
        raise invalid(f"'{param}.name' must not be empty", param=f"{param}.name")
    schema = item.get(schema_key)
    return Tool(
        name=name,
        description=read_str(item, "description", param=f"{param}.description"),
        parameters={} if schema is None else as_object(schema, f"{param}.{schema_key}"),
        strict=_strict(item.get("strict"), f"{param}.strict"),
    )


def _strict(value: JsonValue, param: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise invalid(f"'{param}' must be a boolean", param=param)
    return value is True


# A stop list longer than this is almost certainly a client bug.
MAX_STOPS = 16


def read_stops(value: JsonValue, param: str, *, allow_string: bool) -> tuple[str, ...]:
    """Stop strings: a list of non-empty strings (OpenAI also takes one string)."""
    if value is None:
        return ()
    stops = [value] if allow_string and isinstance(value, str) else as_list(value, param)
    if len(stops) > MAX_STOPS:
        raise invalid(f"'{param}' may hold at most {MAX_STOPS} strings", param=param)
    if not all(isinstance(stop, str) and stop for stop in stops):
        raise invalid(f"'{param}' must hold non-empty strings", param=param)
    return tuple(stop for stop in stops if isinstance(stop, str))


def named_tool(name: JsonValue, tools: tuple[Tool, ...], param: str) -> ToolChoice:
    """The choice of one tool by name, which must be among `tools`."""
    chosen = as_str(name, param)
    if chosen not in {tool.name for tool in tools}:
        raise invalid(f"'{param}' {quote(chosen)} is not among the tools", param=param)
    return ToolChoice(mode=ToolChoiceMode.NAMED, name=chosen)


def read_arguments(value: JsonValue, param: str) -> str:
    """A past tool call's `arguments`: JSON text (an object is written as text).

    The text is kept as sent, but templates read it as JSON: JSON nested
    too deep to read safely is refused here, naming the field.
    """
    if not isinstance(value, str):
        return json.dumps(value)
    try:
        loads(value)
    except TooDeep:
        raise invalid(f"'{param}' nests deeper than {MAX_DEPTH} levels", param=param) from None
    except LoneSurrogate as error:
        raise invalid(f"'{param}' is JSON text where {error}", param=param) from None
    except ValueError:
        pass  # not JSON: templates get the text itself
    return value


# gpt-oss's template reads `reasoning_effort` and knows only these three.
_TEMPLATE_EFFORT = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def effort_kwargs(effort: str) -> dict[str, JsonValue]:
    """Template arguments for a reasoning effort: thinking on or off (Qwen3,
    DeepSeek, through mlx-lm's `enable_thinking`) and gpt-oss's level."""
    return {"enable_thinking": effort not in ("none", "minimal"), "reasoning_effort": _TEMPLATE_EFFORT[effort]}
