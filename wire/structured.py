"""Structured-output fields of every API → one internal `Constraint`.

OpenAI's `response_format` (`json_object`, `json_schema`), the vLLM-style
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` and
`structured_outputs`, Responses' `text.format` and Anthropic's
`output_config.format` all say "the output must match this". The grammar
itself is checked when it compiles (stages/prompt/constraints.py); here only the
shapes are.
"""

from __future__ import annotations

import json

from pipeline.errors import invalid, quote
from pipeline.requests import Constraint, ConstraintKind, JsonValue
from wire.field_reads import Body, as_list, as_object, as_str

_ANY_OBJECT: JsonValue = {"type": "object"}
_GUIDED = {
    "guided_json": ConstraintKind.JSON_SCHEMA,
    "guided_regex": ConstraintKind.REGEX,
    "guided_choice": ConstraintKind.CHOICE,
    "guided_grammar": ConstraintKind.GRAMMAR,
}
_STRUCTURED = {
    "json": ConstraintKind.JSON_SCHEMA,
    "regex": ConstraintKind.REGEX,
    "choice": ConstraintKind.CHOICE,
    "grammar": ConstraintKind.GRAMMAR,
}


def openai_constraint(body: Body) -> Constraint | None:
    """The constraint of a Chat Completions or Completions body, if any."""
    found = [c for c in (_response_format(body), *_guided(body), _structured_outputs(body)) if c is not None]
    if len(found) > 1:
        raise invalid(
            f"Only one structured-output constraint is allowed, got {[c.param for c in found]}", param=found[1].param
        )
    return found[0] if found else None


def responses_constraint(body: Body) -> Constraint | None:
    """`text.format` of a Responses body."""
    text = body.get("text")
    if text is None:
        return None
    raw = as_object(text, "text").get("format")
    if raw is None:
        return None
    format_ = as_object(raw, "text.format")
    kind = format_.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=_ANY_OBJECT, param="text.format")
    if kind == "json_schema":
        return Constraint(
            kind=ConstraintKind.JSON_SCHEMA, spec=_schema(format_, "text.format.schema"), param="text.format.schema"
        )
    raise invalid(f"Invalid 'text.format.type': {quote(kind)}", param="text.format.type")


def anthropic_constraint(body: Body) -> Constraint | None:
    """`output_config.format` of a Messages body, or the structured-outputs beta's top-level `output_format`
    (its earlier name, which litellm sends), the same object."""
    config = body.get("output_config")
    raw = None if config is None else as_object(config, "output_config").get("format")
    beta = body.get("output_format")
    if beta is not None:
        if raw is not None and raw != beta:
            raise invalid("'output_format' and 'output_config.format' differ; send one of them", param="output_format")
        return _anthropic_format(beta, "output_format")
    return None if raw is None else _anthropic_format(raw, "output_config.format")


def _anthropic_format(raw: JsonValue, param: str) -> Constraint:
    format_ = as_object(raw, param)
    if format_.get("type") != "json_schema":
        raise invalid(f"{param}.type: only 'json_schema' is supported", param=f"{param}.type")
    schema = f"{param}.schema"
    return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=_schema(format_, schema), param=schema)


def _response_format(body: Body) -> Constraint | None:
    raw = body.get("response_format")
    if raw is None:
        return None
    format_ = as_object(raw, "response_format")
    kind = format_.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=_ANY_OBJECT, param="response_format")
    if kind == "json_schema":
        spec = as_object(format_.get("json_schema"), "response_format.json_schema")
        param = "response_format.json_schema.schema"
        return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=_schema(spec, param), param=param)
    raise invalid(
        f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {quote(kind)}",
        param="response_format.type",
    )


def _guided(body: Body) -> list[Constraint | None]:
    return [_spec(body.get(key), kind, key) if body.get(key) is not None else None for key, kind in _GUIDED.items()]


def _structured_outputs(body: Body) -> Constraint | None:
    raw = body.get("structured_outputs")
    if raw is None:
        return None
    options = as_object(raw, "structured_outputs")
    present = [key for key in _STRUCTURED if options.get(key) is not None]
    if len(present) != 1:
        raise invalid(f"'structured_outputs' must set exactly one of {sorted(_STRUCTURED)}", param="structured_outputs")
    key = present[0]
    return _spec(options[key], _STRUCTURED[key], f"structured_outputs.{key}")


def _spec(value: JsonValue, kind: ConstraintKind, param: str) -> Constraint:
    if kind is ConstraintKind.JSON_SCHEMA:
        spec = _parse_json(value, param) if isinstance(value, str) else as_object(value, param)
    elif kind is ConstraintKind.CHOICE:
        choices = as_list(value, param)
        if not choices or not all(isinstance(choice, str) for choice in choices):
            raise invalid(f"'{param}' must be a non-empty array of strings", param=param)
        spec = choices
    else:
        spec = as_str(value, param)
    return Constraint(kind=kind, spec=spec, param=param)


def _schema(holder: Body, param: str) -> JsonValue:
    schema = holder.get("schema")
    if schema is None:
        raise invalid(f"Missing required parameter: '{param}'.", param=param)
    return as_object(schema, param)


def _parse_json(text: str, param: str) -> JsonValue:
    try:
        value: JsonValue = json.loads(text)
    except json.JSONDecodeError as error:
        raise invalid(f"'{param}' is not valid JSON: {error}", param=param) from None
    return as_object(value, param)
