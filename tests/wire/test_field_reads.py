"""wire/field_reads.py: typed reads of JSON fields, each failure naming its parameter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import JsonValue
from wire import field_reads

Read = Callable[[], object]


@pytest.mark.parametrize(
    ("read", "expected"),
    [
        pytest.param(lambda: field_reads.as_body({"a": 1}), {"a": 1}, id="as_body-object"),
        pytest.param(lambda: field_reads.as_object({}, "p"), {}, id="as_object-empty"),
        pytest.param(lambda: field_reads.as_list([1, "x"], "p"), [1, "x"], id="as_list"),
        pytest.param(lambda: field_reads.as_str("", "p"), "", id="as_str-empty"),
        pytest.param(lambda: field_reads.read_str({}, "k"), None, id="read_str-missing"),
        pytest.param(lambda: field_reads.read_str({"k": None}, "k"), None, id="read_str-null"),
        pytest.param(lambda: field_reads.read_str({"k": "v"}, "k"), "v", id="read_str"),
        pytest.param(lambda: field_reads.read_bool({}, "k"), None, id="read_bool-missing"),
        pytest.param(lambda: field_reads.read_bool({"k": False}, "k"), False, id="read_bool-false"),
        pytest.param(lambda: field_reads.read_bool({"k": True}, "k"), True, id="read_bool-true"),
        pytest.param(lambda: field_reads.read_int({}, "k"), None, id="read_int-missing"),
        pytest.param(lambda: field_reads.read_int({"k": 7}, "k"), 7, id="read_int"),
        pytest.param(lambda: field_reads.read_int({"k": 3.0}, "k"), 3, id="read_int-integral-float"),
        pytest.param(lambda: field_reads.read_int({"k": 1}, "k", minimum=1, maximum=1), 1, id="read_int-at-bounds"),
        pytest.param(lambda: field_reads.read_number({"k": 1}, "k"), 1.0, id="read_number-int"),
        pytest.param(lambda: field_reads.read_number({"k": 0.5}, "k", minimum=0, maximum=1), 0.5, id="read_number"),
        pytest.param(lambda: field_reads.read_number({"k": None}, "k"), None, id="read_number-null"),
        pytest.param(lambda: field_reads.read_object({"k": {"x": 1}}, "k"), {"x": 1}, id="read_object"),
        pytest.param(lambda: field_reads.read_object({}, "k"), None, id="read_object-missing"),
    ],
)
def test_valid_values_read_back(read: Read, expected: object) -> None:
    """A well-typed value (or an absent one, as None) is returned unchanged."""
    value = read()
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("read", "param", "gist"),
    [
        pytest.param(lambda: field_reads.as_body([1]), None, "must be a JSON object, got an array", id="as_body-array"),
        pytest.param(
            lambda: field_reads.as_body("x"), None, "must be a JSON object, got a string", id="as_body-string"
        ),
        pytest.param(lambda: field_reads.as_object([], "a.b"), "a.b", "'a.b' must be a JSON object", id="as_object"),
        pytest.param(lambda: field_reads.as_list({}, "xs"), "xs", "'xs' must be an array", id="as_list"),
        pytest.param(lambda: field_reads.as_str(3, "s"), "s", "'s' must be a string", id="as_str-int"),
        pytest.param(lambda: field_reads.as_str(None, "s"), "s", "'s' must be a string", id="as_str-null"),
        pytest.param(
            lambda: field_reads.read_str({"k": 1}, "k", param="m[0].k"),
            "m[0].k",
            "'m[0].k' must be a string",
            id="read_str-param-override",
        ),
        pytest.param(
            lambda: field_reads.read_bool({"k": "true"}, "k"), "k", "'k' must be a boolean", id="read_bool-str"
        ),
        pytest.param(lambda: field_reads.read_bool({"k": 1}, "k"), "k", "'k' must be a boolean", id="read_bool-int"),
        pytest.param(lambda: field_reads.read_int({"k": True}, "k"), "k", "'k' must be an integer", id="read_int-bool"),
        pytest.param(
            lambda: field_reads.read_int({"k": 1.5}, "k"), "k", "'k' must be an integer", id="read_int-fraction"
        ),
        pytest.param(lambda: field_reads.read_int({"k": "3"}, "k"), "k", "'k' must be an integer", id="read_int-str"),
        pytest.param(
            lambda: field_reads.read_int({"k": float("nan")}, "k"), "k", "'k' must be an integer", id="read_int-nan"
        ),
        pytest.param(
            lambda: field_reads.read_int({"k": 0}, "k", minimum=1), "k", "'k' must be >= 1, got 0", id="read_int-below"
        ),
        pytest.param(
            lambda: field_reads.read_int({"k": 9}, "k", maximum=8), "k", "'k' must be <= 8, got 9", id="read_int-above"
        ),
        pytest.param(
            lambda: field_reads.read_number({"k": False}, "k"), "k", "'k' must be a number", id="read_number-bool"
        ),
        pytest.param(
            lambda: field_reads.read_number({"k": "0.5"}, "k"), "k", "'k' must be a number", id="read_number-str"
        ),
        pytest.param(
            lambda: field_reads.read_number({"k": -0.1}, "k", minimum=0),
            "k",
            "'k' must be >= 0",
            id="read_number-below",
        ),
        pytest.param(
            lambda: field_reads.read_number({"k": 2.5}, "k", maximum=2), "k", "'k' must be <= 2", id="read_number-above"
        ),
        # Python's json module accepts NaN and Infinity, so these do reach the decoders.
        pytest.param(lambda: field_reads.read_number({"k": float("nan")}, "k"), "k", "'k'", id="read_number-nan"),
        pytest.param(
            lambda: field_reads.read_number({"k": float("nan")}, "k", minimum=0, maximum=2),
            "k",
            "'k'",
            id="read_number-nan-in-range-check",
        ),
        pytest.param(
            lambda: field_reads.read_object({"k": []}, "k"), "k", "'k' must be a JSON object", id="read_object"
        ),
    ],
)
def test_bad_values_name_their_parameter(read: Read, param: str | None, gist: str) -> None:
    """A wrong type or range is a 400 whose `param` is the field as the client spelled it."""
    with pytest.raises(RequestError) as caught:
        read()
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert caught.value.status == 400
    assert caught.value.param == param
    assert gist in caught.value.message


def test_read_helpers_do_not_mutate_the_body() -> None:
    """Reading is pure: the decoded JSON is left exactly as it came."""
    body: dict[str, JsonValue] = {"n": 2.0, "s": "x", "o": {"a": [1]}}
    snapshot = {"n": 2.0, "s": "x", "o": {"a": [1]}}
    field_reads.read_int(body, "n")
    field_reads.read_str(body, "s")
    field_reads.read_object(body, "o")
    assert body == snapshot


def test_strict_rides_on_the_tool_in_every_api() -> None:
    from wire.anthropic_requests import decode_messages
    from wire.openai_requests import decode_chat
    from wire.responses_requests import decode_responses

    schema = {"type": "object", "properties": {}}
    chat = decode_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}],
        }
    )
    responses = decode_responses(
        {"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", "parameters": schema, "strict": True}]}
    )
    messages = decode_messages(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": schema, "strict": True}],
        }
    )
    assert [request.tools[0].strict for request in (chat, responses, messages)] == [True, True, True]
    loose = decode_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        }
    )
    assert loose.tools[0].strict is False


def test_strict_must_be_a_boolean() -> None:
    from wire.openai_requests import decode_chat

    with pytest.raises(RequestError) as caught:
        decode_chat(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}],
            }
        )
    assert caught.value.param == "tools[0].function.strict"
