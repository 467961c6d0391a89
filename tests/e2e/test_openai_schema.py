"""Every OpenAI route's bodies and stream events validate against OpenAI's published OpenAPI schemas
(tests/fixtures/openai_openapi, pinned): chat, completions, responses (bodies, every stream event, the stored
response and its input items), embeddings, models and errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import loopback
from tests.conftest import Server
from tests.e2e.conftest import stream_chunks
from tests.openai_schema import assert_valid, assert_valid_event, completion_chunk_as_body

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}]
TEXT_FORMAT = {"format": {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}}


def post(server: Server, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = loopback.post(f"{server.v1}{path}", json={"model": "m", **body}, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


CHAT_BODIES = {
    "plain": {"messages": USER, "max_tokens": 4, "logprobs": True, "top_logprobs": 2},
    "tool-call": {"messages": USER, "max_tokens": 40, "tools": CHAT_TOOLS, "tool_choice": "required"},
    "format": {"messages": USER, "max_tokens": 40, "response_format": {"type": "json_object"}},
}


@pytest.mark.parametrize("case", sorted(CHAT_BODIES))
def test_chat_body_and_chunks(server: Server, case: str) -> None:
    body = CHAT_BODIES[case]
    assert_valid("CreateChatCompletionResponse", post(server, "/chat/completions", body))
    chunks = stream_chunks(
        server, "/chat/completions", {"model": "m", **body, "stream_options": {"include_usage": True}}
    )
    assert chunks[-1] == "[DONE]"
    for chunk in chunks[:-1]:
        assert_valid("CreateChatCompletionStreamResponse", chunk)


def test_completions_body_and_chunks(server: Server) -> None:
    body = {"prompt": "Once upon", "max_tokens": 4, "logprobs": 2}
    assert_valid("CreateCompletionResponse", post(server, "/completions", body))
    chunks = stream_chunks(server, "/completions", {"model": "m", **body, "stream_options": {"include_usage": True}})
    for chunk in chunks[:-1]:
        assert_valid("CreateCompletionResponse", completion_chunk_as_body(chunk))  # type: ignore[arg-type]


RESPONSES_BODIES = {
    "plain": {"input": "Hello", "max_output_tokens": 4},
    "finished": {"input": "Hello", "max_output_tokens": 40, "text": TEXT_FORMAT, "user": "u1", "metadata": {"k": "v"}},
    "tool-call": {"input": USER, "max_output_tokens": 40, "tools": RESPONSES_TOOLS, "tool_choice": "required"},
    "history": {
        "input": [
            {"role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Weather?"},
        ],
        "max_output_tokens": 4,
    },
}


@pytest.mark.parametrize("case", sorted(RESPONSES_BODIES))
def test_responses_body_events_stored_response_and_input_items(server: Server, case: str) -> None:
    body = RESPONSES_BODIES[case]
    response = post(server, "/responses", body)
    assert_valid("Response", response)
    stored = loopback.get(f"{server.v1}/responses/{response['id']}", timeout=30).json()
    assert_valid("Response", stored)
    items = loopback.get(f"{server.v1}/responses/{response['id']}/input_items", timeout=30).json()
    assert_valid("ResponseItemList", items)
    events = [event for event in stream_chunks(server, "/responses", {"model": "m", **body}) if isinstance(event, dict)]
    assert events[0]["type"] == "response.created" and events[-1]["type"] in (
        "response.completed",
        "response.incomplete",
    )
    for event in events:
        assert_valid_event(event)
        assert_valid("ResponseStreamEvent", event)


def test_input_items_echo_message_text_as_parts(server: Server) -> None:
    response = post(server, "/responses", {"input": "Hello", "max_output_tokens": 2})
    items = loopback.get(f"{server.v1}/responses/{response['id']}/input_items", timeout=30).json()
    assert items["data"][0]["content"] == [{"type": "input_text", "text": "Hello"}]
    assert "user" not in response


def test_created_and_in_progress_carry_no_usage_until_there_is_some(server: Server) -> None:
    events = [
        e
        for e in stream_chunks(server, "/responses", {"model": "m", "input": "Hi", "max_output_tokens": 2})
        if isinstance(e, dict)
    ]
    opening = [event["response"] for event in events if event["type"] in ("response.created", "response.in_progress")]
    assert len(opening) == 2 and all("usage" not in response for response in opening)
    assert isinstance(events[-1]["response"]["usage"], dict)  # type: ignore[index]


def test_embeddings_body(server: Server) -> None:
    assert_valid(
        "CreateEmbeddingResponse", post(server, "/embeddings", {"input": ["a", "b"], "encoding_format": "float"})
    )


def test_models(server: Server) -> None:
    listed = loopback.get(f"{server.v1}/models", timeout=30).json()
    assert_valid("ListModelsResponse", listed)
    one = loopback.get(f"{server.v1}/models/{listed['data'][0]['id']}", timeout=30).json()
    assert_valid("Model", one)


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/chat/completions", {"model": "m"}, 400),
        ("POST", "/completions", {"model": "m", "prompt": "x", "n": 3}, 400),
        ("POST", "/responses", {"model": "m"}, 400),
        ("POST", "/embeddings", {"model": "m", "input": []}, 400),
        ("GET", "/responses/resp_0123456789abcdef0123456789abcdef", None, 404),
        ("GET", "/models/nope", None, 404),
    ],
)
def test_errors(server: Server, method: str, path: str, body: dict[str, Any] | None, status: int) -> None:
    response = loopback.request(method, f"{server.v1}{path}", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert_valid("ErrorResponse", json.loads(response.text))
