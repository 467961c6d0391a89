"""wire/structured.py: every API's structured-output fields → one `Constraint`.

Tables of bodies and the exact constraint (or None) each yields, and of
bad bodies and the 400 each raises, per API spelling: OpenAI's
`response_format`, the vLLM-style `guided_*` and `structured_outputs`,
Responses' `text.format` and Anthropic's `output_config.format`. Only
shapes are checked here; grammars compile later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import Constraint, ConstraintKind, JsonValue
from wire.field_reads import Body
from wire.structured import anthropic_constraint, openai_constraint, responses_constraint

SCHEMA: dict[str, JsonValue] = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
ANY_OBJECT: dict[str, JsonValue] = {"type": "object"}
GRAMMAR = 'start: "yes" | "no"'


def json_schema(spec: JsonValue, param: str) -> Constraint:
    return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=spec, param=param)


def constraint(kind: ConstraintKind, spec: JsonValue, param: str) -> Constraint:
    return Constraint(kind=kind, spec=spec, param=param)


OPENAI = [
    pytest.param({}, None, id="none"),
    pytest.param({"response_format": None, "guided_json": None, "structured_outputs": None}, None, id="all-null"),
    pytest.param({"response_format": {"type": "text"}}, None, id="response_format-text"),
    pytest.param(
        {"response_format": {"type": "json_object"}}, json_schema(ANY_OBJECT, "response_format"), id="json_object"
    ),
    pytest.param(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}},
        json_schema(SCHEMA, "response_format.json_schema.schema"),
        id="json_schema",
    ),
    pytest.param({"guided_json": SCHEMA}, json_schema(SCHEMA, "guided_json"), id="guided_json-object"),
    pytest.param(
        {"guided_json": '{"type": "object", "required": ["n"]}'},
        json_schema({"type": "object", "required": ["n"]}, "guided_json"),
        id="guided_json-text",
    ),
    pytest.param(
        {"guided_regex": r"\d{3}"}, constraint(ConstraintKind.REGEX, r"\d{3}", "guided_regex"), id="guided_regex"
    ),
    pytest.param(
        {"guided_choice": ["yes", "no"]},
        constraint(ConstraintKind.CHOICE, ["yes", "no"], "guided_choice"),
        id="guided_choice",
    ),
    pytest.param(
        {"guided_grammar": GRAMMAR}, constraint(ConstraintKind.GRAMMAR, GRAMMAR, "guided_grammar"), id="guided_grammar"
    ),
    pytest.param(
        {"structured_outputs": {"json": SCHEMA}},
        json_schema(SCHEMA, "structured_outputs.json"),
        id="structured_outputs-json",
    ),
    pytest.param(
        {"structured_outputs": {"json": '{"type": "object"}'}},
        json_schema(ANY_OBJECT, "structured_outputs.json"),
        id="structured_outputs-json-text",
    ),
    pytest.param(
        {"structured_outputs": {"regex": "[a-z]+"}},
        constraint(ConstraintKind.REGEX, "[a-z]+", "structured_outputs.regex"),
        id="structured_outputs-regex",
    ),
    pytest.param(
        {"structured_outputs": {"choice": ["a"]}},
        constraint(ConstraintKind.CHOICE, ["a"], "structured_outputs.choice"),
        id="structured_outputs-choice",
    ),
    pytest.param(
        {"structured_outputs": {"grammar": GRAMMAR, "json": None}},
        constraint(ConstraintKind.GRAMMAR, GRAMMAR, "structured_outputs.grammar"),
        id="structured_outputs-grammar-null-others-ignored",
    ),
    pytest.param(
        {"response_format": {"type": "text"}, "guided_regex": "x+"},
        constraint(ConstraintKind.REGEX, "x+", "guided_regex"),
        id="text-format-is-no-constraint-beside-guided",
    ),
]


@pytest.mark.parametrize(("body", "expected"), OPENAI)
def test_openai_constraint(body: Body, expected: Constraint | None) -> None:
    """Each OpenAI-side spelling yields its one constraint, naming the field it came from."""
    assert openai_constraint(body) == expected


def bad(body: JsonValue, param: str, gist: str, *, id: str) -> Any:
    return pytest.param(body, param, gist, id=id)


OPENAI_BAD = [
    bad(
        {"response_format": {"type": "json_object"}, "guided_json": SCHEMA},
        "guided_json",
        "Only one",
        id="response_format-and-guided_json",
    ),
    bad({"guided_regex": "x", "guided_choice": ["a"]}, "guided_choice", "Only one", id="two-guided"),
    bad(
        {"guided_json": SCHEMA, "structured_outputs": {"regex": "x"}},
        "structured_outputs.regex",
        "Only one",
        id="guided-and-structured_outputs",
    ),
    bad({"response_format": {"type": "xml"}}, "response_format.type", "'xml'", id="response_format-bad-type"),
    bad({"response_format": {}}, "response_format.type", "None", id="response_format-no-type"),
    bad({"response_format": "json_object"}, "response_format", "must be a JSON object", id="response_format-string"),
    bad(
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "must be a JSON object",
        id="json_schema-missing",
    ),
    bad(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
        "response_format.json_schema.schema",
        "Missing required parameter",
        id="json_schema-schema-missing",
    ),
    bad(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": "{}"}}},
        "response_format.json_schema.schema",
        "must be a JSON object",
        id="json_schema-schema-string",
    ),
    bad({"guided_choice": []}, "guided_choice", "non-empty array of strings", id="guided_choice-empty"),
    bad({"guided_choice": ["a", 1]}, "guided_choice", "non-empty array of strings", id="guided_choice-non-string"),
    bad({"guided_choice": "a"}, "guided_choice", "must be an array", id="guided_choice-string"),
    bad({"guided_json": "{not json"}, "guided_json", "is not valid JSON", id="guided_json-invalid-text"),
    bad({"guided_json": "[1, 2]"}, "guided_json", "must be a JSON object", id="guided_json-text-not-object"),
    bad({"guided_json": 5}, "guided_json", "must be a JSON object", id="guided_json-number"),
    bad({"guided_regex": 5}, "guided_regex", "must be a string", id="guided_regex-number"),
    bad({"guided_grammar": ["x"]}, "guided_grammar", "must be a string", id="guided_grammar-list"),
    bad({"structured_outputs": {}}, "structured_outputs", "exactly one", id="structured_outputs-zero-keys"),
    bad(
        {"structured_outputs": {"disable_fallback": True}},
        "structured_outputs",
        "exactly one",
        id="structured_outputs-unknown-key-only",
    ),
    bad(
        {"structured_outputs": {"json": SCHEMA, "regex": "x"}},
        "structured_outputs",
        "exactly one",
        id="structured_outputs-two-keys",
    ),
    bad({"structured_outputs": "json"}, "structured_outputs", "must be a JSON object", id="structured_outputs-string"),
    bad(
        {"structured_outputs": {"choice": []}},
        "structured_outputs.choice",
        "non-empty",
        id="structured_outputs-choice-empty",
    ),
]


def raises(decode: Callable[[Body], Constraint | None], body: Body) -> RequestError:
    with pytest.raises(RequestError) as caught:
        decode(body)
    assert (caught.value.kind, caught.value.status) == (ErrorKind.INVALID_REQUEST, 400)
    return caught.value


@pytest.mark.parametrize(("body", "param", "gist"), OPENAI_BAD)
def test_openai_constraint_rejects(body: Body, param: str, gist: str) -> None:
    """A malformed or doubled constraint is a 400 naming the field (the second one, if doubled)."""
    error = raises(openai_constraint, body)
    assert error.param == param
    assert gist in error.message


RESPONSES = [
    pytest.param({}, None, id="no-text"),
    pytest.param({"text": {"verbosity": "low"}}, None, id="no-format"),
    pytest.param({"text": {"format": {"type": "text"}}}, None, id="format-text"),
    pytest.param(
        {"text": {"format": {"type": "json_object"}}}, json_schema(ANY_OBJECT, "text.format"), id="json_object"
    ),
    pytest.param(
        {"text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True}}},
        json_schema(SCHEMA, "text.format.schema"),
        id="json_schema",
    ),
]

RESPONSES_BAD = [
    bad({"text": "json"}, "text", "must be a JSON object", id="text-string"),
    bad({"text": {"format": "json_object"}}, "text.format", "must be a JSON object", id="format-string"),
    bad({"text": {"format": {"type": "grammar"}}}, "text.format.type", "'grammar'", id="format-bad-type"),
    bad(
        {"text": {"format": {"type": "json_schema", "name": "n"}}},
        "text.format.schema",
        "Missing required parameter",
        id="schema-missing",
    ),
    bad(
        {"text": {"format": {"type": "json_schema", "schema": []}}},
        "text.format.schema",
        "must be a JSON object",
        id="schema-array",
    ),
]

ANTHROPIC = [
    pytest.param({}, None, id="no-output_config"),
    pytest.param({"output_config": {"effort": "low"}}, None, id="no-format"),
    pytest.param(
        {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
        json_schema(SCHEMA, "output_config.format.schema"),
        id="json_schema",
    ),
]

ANTHROPIC_BAD = [
    bad({"output_config": "json"}, "output_config", "must be a JSON object", id="output_config-string"),
    bad({"output_config": {"format": "json"}}, "output_config.format", "must be a JSON object", id="format-string"),
    bad(
        {"output_config": {"format": {"type": "json_object"}}},
        "output_config.format.type",
        "only 'json_schema'",
        id="format-json_object",
    ),
    bad(
        {"output_config": {"format": {"type": "json_schema"}}},
        "output_config.format.schema",
        "Missing required parameter",
        id="schema-missing",
    ),
]


@pytest.mark.parametrize(("body", "expected"), RESPONSES)
def test_responses_constraint(body: Body, expected: Constraint | None) -> None:
    """Responses' text.format yields a JSON-schema constraint, or none for plain text."""
    assert responses_constraint(body) == expected


@pytest.mark.parametrize(("body", "param", "gist"), RESPONSES_BAD)
def test_responses_constraint_rejects(body: Body, param: str, gist: str) -> None:
    """A malformed text.format is a 400 naming its field."""
    error = raises(responses_constraint, body)
    assert error.param == param
    assert gist in error.message


@pytest.mark.parametrize(("body", "expected"), ANTHROPIC)
def test_anthropic_constraint(body: Body, expected: Constraint | None) -> None:
    """Anthropic's output_config.format yields a JSON-schema constraint; effort alone is advisory."""
    assert anthropic_constraint(body) == expected


@pytest.mark.parametrize(("body", "param", "gist"), ANTHROPIC_BAD)
def test_anthropic_constraint_rejects(body: Body, param: str, gist: str) -> None:
    """A malformed output_config.format is a 400 naming its field."""
    error = raises(anthropic_constraint, body)
    assert error.param == param
    assert gist in error.message
