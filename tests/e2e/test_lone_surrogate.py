"""A lone UTF-16 surrogate in any string of a body is a 400 naming the field, on every route, h1 and h2.

JSON's `\\ud800` escape decodes to a Python string that is not Unicode
text; before, the first encoder downstream (the tokenizer) raised and the
client got a 500. The body is sent as raw text so the escape reaches the
server as the client wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Server

# A placeholder json.dumps leaves alone, swapped for the raw escape after dumping.
LONE = "LONE-SURROGATE"
HELLO = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

ASKS = [{"role": "user", "content": LONE}]
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"
CASES: list[tuple[str, dict[str, object], str]] = [
    (CHAT, {"messages": ASKS, "max_tokens": 4}, "messages[0].content"),
    (
        CHAT,
        {"messages": HELLO, "tools": [TOOL, {"type": "function", "function": {"name": LONE}}]},
        "tools[1].function.name",
    ),
    (CHAT, {"messages": HELLO, "max_tokens": 4, "stop": ["x", LONE]}, "stop[1]"),
    ("/v1/completions", {"prompt": LONE, "max_tokens": 4}, "prompt"),
    ("/v1/responses", {"input": LONE, "max_output_tokens": 16}, "input"),
    ("/v1/responses", {"input": "hi", "instructions": LONE, "max_output_tokens": 16}, "instructions"),
    (MESSAGES, {"messages": ASKS, "max_tokens": 4}, "messages[0].content"),
    (MESSAGES, {"messages": HELLO, "max_tokens": 4, "tools": [{"name": LONE, "input_schema": {}}]}, "tools[0].name"),
    ("/v1/messages/count_tokens", {"messages": ASKS}, "messages[0].content"),
    ("/v1/embeddings", {"input": ["ok", LONE]}, "input[1]"),
    ("/tokenize", {"prompt": LONE}, "prompt"),
    ("/v1/rerank", {"query": "q", "documents": ["a", LONE]}, "documents[1]"),
    ("/v1/score", {"text_1": LONE, "text_2": "b"}, "text_1"),
]


def raw_body(path: str, body: dict[str, object]) -> bytes:
    model = {"model": "m"} if path != "/tokenize" else {}
    return json.dumps({**model, **body}).replace(LONE, "a\\ud800b").encode()


@pytest.fixture(scope="module", params=["HTTP/1.1", "HTTP/2"])
def http(request: pytest.FixtureRequest, server: Server) -> Iterator[httpx.Client]:
    # h2 with prior knowledge: hypercorn speaks h2c on a plain socket.
    h2 = request.param == "HTTP/2"
    with httpx.Client(base_url=server.base_url, http1=not h2, http2=h2, timeout=60) as client:
        client.headers["x-expected-version"] = request.param
        yield client


@pytest.mark.parametrize(("path", "body", "param"), CASES, ids=[f"{path}:{param}" for path, _, param in CASES])
def test_a_lone_surrogate_is_a_400_naming_the_field(
    http: httpx.Client, path: str, body: dict[str, object], param: str
) -> None:
    response = http.post(path, content=raw_body(path, body), headers={"content-type": "application/json"})
    assert response.http_version == http.headers["x-expected-version"]
    assert response.status_code == 400, response.text
    payload = response.json()
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
        message = payload["error"]["message"]
    else:
        error = payload["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, error
        message = error["message"]
    assert f"'{param}'" in message and "surrogate" in message, message


def test_a_surrogate_pair_is_text(http: httpx.Client) -> None:
    """A pair spelled as two escapes is one character, served as usual."""
    body = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 2}'
    response = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


def test_tool_call_arguments_holding_one_are_refused(http: httpx.Client) -> None:
    """Past call arguments are JSON text read again for the template: a surrogate escaped inside it is refused too."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": "\\ud800"}'}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    body = {"model": "m", "messages": messages, "tools": [TOOL], "max_tokens": 2}
    response = http.post(CHAT, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
