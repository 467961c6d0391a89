"""Structured outputs and forced tool calls: valid whatever the random weights."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server
from tests.e2e.conftest import stream_chunks

HELLO = [{"role": "user", "content": "Describe a person."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Clock",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_always_validates(client: openai.OpenAI, seed: int) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,  # type: ignore[arg-type]
        max_tokens=300,
        temperature=1.0,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def test_json_object_and_streaming(server: Server, tokenizer: Tokenizer) -> None:
    # A random model rarely closes a JSON string on its own, and when it does depends on the BLAS's
    # numerics; a bias toward quotes and braces closes every string and the object within a few tokens.
    # Outside the grammar the bias would write bare quotes and braces, which json.loads refuses.
    closing = {str(tokenizer.token_to_id(token)): 30 for token in ('"', "}")}
    json_object = {"type": "json_object"}
    body = {"messages": HELLO, "max_tokens": 200, "seed": 5, "response_format": json_object, "logit_bias": closing}
    chunks = [c for c in stream_chunks(server, "/chat/completions", body) if isinstance(c, dict)]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])  # type: ignore[index]
    assert isinstance(json.loads(text), dict)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": r"\d{3}-[a-z]{2}"}, lambda text: re.fullmatch(r"\d{3}-[a-z]{2}", text)),
        ({"guided_choice": ["red", "green", "blue"]}, lambda text: text in ("red", "green", "blue")),
        (
            {"guided_grammar": 'start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]{1,2}/'},
            lambda text: re.fullmatch(r"yes|no|maybe [0-9]{1,2}", text),
        ),
        ({"structured_outputs": {"regex": "(ab)+c"}}, lambda text: re.fullmatch("(ab)+c", text) and len(text) < 200),
        ({"guided_json": json.dumps(WEATHER)}, lambda text: jsonschema.validate(json.loads(text), WEATHER) is None),
    ],
    ids=["regex", "choice", "grammar", "structured-outputs", "guided-json-string"],
)
def test_guided_extras(client: openai.OpenAI, extra: dict[str, object], check: object) -> None:
    for seed in (1, 2):
        completion = client.chat.completions.create(
            model="m",
            messages=HELLO,
            max_tokens=120,
            seed=seed,
            extra_body=extra,  # type: ignore[arg-type]
        )
        text = completion.choices[0].message.content or ""
        assert check(text), text  # type: ignore[operator]
        assert completion.choices[0].finish_reason == "stop"


def test_completions_take_constraints_too(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="m", prompt="Code:", max_tokens=20, seed=3, extra_body={"guided_regex": "[A-Z]{4}"}
    )
    assert re.fullmatch("[A-Z]{4}", completion.choices[0].text)


def test_max_tokens_cut_is_length(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=3,
        temperature=0,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
    )
    assert completion.choices[0].finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(completion.choices[0].message.content or "")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"guided_regex": "[a-z"}, "guided_regex"),
        ({"guided_grammar": "start: (("}, "guided_grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
    ],
    ids=[
        "bad-schema",
        "no-schema",
        "bad-type",
        "bad-regex",
        "bad-grammar",
        "empty-choice",
        "bad-json",
        "two",
        "no-tools",
        "unknown-tool",
    ],
)
def test_invalid_constraints_are_400(server: Server, extra: dict[str, object], param: str) -> None:
    response = loopback.post(
        f"{server.v1}/chat/completions", json={"messages": HELLO, "max_tokens": 5, **extra}, timeout=30
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_constrained_and_free_rows_share_a_batch(server: Server) -> None:
    def run(i: int) -> tuple[str, str]:
        body: dict[str, object] = {"messages": [{"role": "user", "content": f"n{i}"}], "max_tokens": 60, "seed": i}
        if i % 2:
            body["guided_regex"] = "[0-9]{2,5}"
        barrier.wait(timeout=30)
        answer = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=60).json()
        return answer["choices"][0]["message"]["content"], answer["choices"][0]["finish_reason"]

    barrier = threading.Barrier(8)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(8)))
    for i, (text, finish) in enumerate(results):
        if i % 2:
            assert re.fullmatch("[0-9]{2,5}", text) and finish == "stop"
        else:
            assert finish in ("length", "stop")


def assert_valid_call(name: str, arguments: str) -> None:
    assert name in ("get_weather", "get_time")
    schema = WEATHER if name == "get_weather" else TOOLS[1]["function"]["parameters"]  # type: ignore[index]
    jsonschema.validate(json.loads(arguments), schema)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_tool_choice_required_makes_a_valid_call(client: openai.OpenAI, seed: int) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=200,
        seed=seed,  # type: ignore[arg-type]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert_valid_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]
    assert "<tool_call>" not in (choice.message.content or "")


def test_named_tool_choice_streams_tool_call_deltas(server: Server) -> None:
    body = {
        "messages": HELLO,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 200,
        "seed": 9,
    }
    chunks = [c for c in stream_chunks(server, "/chat/completions", body) if isinstance(c, dict) and c["choices"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]  # type: ignore[index]
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    # One call, its head first, then its arguments in pieces.
    assert {call["index"] for call in calls} == {0} and len(calls) >= 2
    assert calls[0]["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads("".join(c["function"]["arguments"] for c in calls)), WEATHER)
    assert not any("<tool_call>" in (d.get("content") or "") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]


def test_anthropic_tool_choice_any(server: Server) -> None:
    claude = server.anthropic_client()
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]  # type: ignore[index]
    message = claude.messages.create(
        model="m",
        max_tokens=200,
        messages=HELLO,
        tools=tools,
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},  # type: ignore[arg-type]
    )
    assert message.stop_reason == "tool_use"
    (block,) = [b for b in message.content if b.type == "tool_use"]
    assert block.id.startswith("toolu_")  # type: ignore[union-attr]
    assert_valid_call(block.name, json.dumps(block.input))  # type: ignore[union-attr]
    with claude.messages.stream(
        model="m",
        max_tokens=200,
        messages=HELLO,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},  # type: ignore[arg-type]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "content_block_start" in kinds and final.stop_reason == "tool_use"
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    jsonschema.validate(streamed.input, WEATHER)  # type: ignore[union-attr]


def test_anthropic_output_format(server: Server) -> None:
    claude = server.anthropic_client()
    message = claude.messages.create(
        model="m",
        max_tokens=300,
        messages=HELLO,
        output_config={"format": {"type": "json_schema", "schema": PERSON}},
        extra_body={"temperature": 0},  # type: ignore[arg-type, typeddict-item]
    )
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), PERSON)  # type: ignore[union-attr]


def test_responses_json_schema_completes(client: openai.OpenAI) -> None:
    text_format = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}
    response = client.responses.create(model="m", input="Describe a person.", text=text_format, max_output_tokens=300)  # type: ignore[arg-type]
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), PERSON)
    with client.responses.stream(model="m", input="Again.", text=text_format, max_output_tokens=300) as stream:  # type: ignore[arg-type]
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[-1] == "response.completed"
    jsonschema.validate(json.loads(final.output_text), PERSON)


def test_responses_forced_function_call(server: Server, client: openai.OpenAI) -> None:
    tools = [{"type": "function", **t["function"]} for t in TOOLS]  # type: ignore[dict-item]
    response = client.responses.create(
        model="m",
        input="Weather?",
        tools=tools,
        tool_choice="required",
        max_output_tokens=200,  # type: ignore[arg-type]
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.call_id.startswith("call_")  # type: ignore[union-attr]
    assert_valid_call(call.name, call.arguments)  # type: ignore[union-attr]
    body = {
        "model": "m",
        "input": "Weather?",
        "tools": tools,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 200,
        "stream": True,
    }
    with loopback.stream("POST", f"{server.v1}/responses", json=body, timeout=60) as stream:
        events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
    types = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    jsonschema.validate(json.loads(done["arguments"]), WEATHER)
    # Its output replays as history: the function call and its result.
    follow = client.responses.create(
        model="m",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],  # type: ignore[union-attr]
        tools=tools,  # type: ignore[arg-type]
        max_output_tokens=3,
    )
    assert follow.usage is not None and response.usage is not None
    assert follow.usage.input_tokens > response.usage.input_tokens


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_ends_the_turn_at_the_first_call(
    client: openai.OpenAI, tokenizer: Tokenizer, parallel: bool
) -> None:
    # A grammar makes the model write two calls in its own markup; the sink parses them.
    start, end = tokenizer.token_to_id("<tool_call>"), tokenizer.token_to_id("</tool_call>")
    call = '"\\n{\\"name\\": \\"get_time\\", \\"arguments\\": {}}\\n"'
    grammar = f"start: <[{start}]> {call} <[{end}]> <[{start}]> {call} <[{end}]>"
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        tools=TOOLS,
        max_tokens=100,
        parallel_tool_calls=parallel,  # type: ignore[arg-type]
        extra_body={"guided_grammar": grammar},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_time"] * (2 if parallel else 1)  # type: ignore[union-attr]
