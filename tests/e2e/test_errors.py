"""Bad input gets OpenAI-shaped errors that name the field; the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests import loopback
from tests.conftest import Server

HELLO = [{"role": "user", "content": "hi"}]


def post(server: Server, path: str, content: bytes | str) -> httpx.Response:
    return loopback.post(
        f"{server.v1}{path}", content=content, headers={"content-type": "application/json"}, timeout=30
    )


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param
    return dict(error)


@pytest.mark.parametrize(
    ("path", "content", "param"),
    [
        ("/chat/completions", b"{not json", None),
        ("/chat/completions", b"\xff\xfe", None),
        ("/chat/completions", b"[1, 2]", None),
        ("/completions", b'"just a string"', None),
    ],
    ids=["invalid-json", "not-utf8", "array-body", "string-body"],
)
def test_malformed_bodies(server: Server, path: str, content: bytes, param: str | None) -> None:
    error = assert_openai_error(post(server, path, content), 400, param)
    assert error["type"] == "invalid_request_error"


CHAT_CASES = [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content[0]",
    ),
    ({"messages": HELLO, "max_tokens": -1}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 2.5}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": "10"}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": True}, "max_tokens"),
    ({"messages": HELLO, "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"messages": HELLO, "temperature": -1}, "temperature"),
    ({"messages": HELLO, "top_p": 1.5}, "top_p"),
    ({"messages": HELLO, "stop": 5}, "stop"),
    ({"messages": HELLO, "seed": "x"}, "seed"),
    ({"messages": HELLO, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": HELLO, "logit_bias": {"999999": 1}}, "logit_bias"),
    ({"messages": HELLO, "stream": "yes"}, "stream"),
    ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": HELLO, "chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"messages": HELLO, "max_tokens": 4000}, "max_tokens"),
    ({"messages": HELLO, "reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    (
        {"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
        "tools[0].function.parameters",
    ),
    ({"messages": HELLO, "tool_choice": "sometimes"}, "tool_choice"),
    (
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]}]},
        "messages[0].tool_calls[0].function.name",
    ),
    ({"messages": [{"role": "user", "content": "word " * 2100}]}, "messages"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_CASES, ids=[f"{i}-{p}" for i, (_, p) in enumerate(CHAT_CASES)])
def test_bad_chat_fields_name_the_param(server: Server, body: dict[str, object], param: str) -> None:
    response = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=30)
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error"


def test_context_overflow_has_its_code(server: Server) -> None:
    response = loopback.post(f"{server.v1}/chat/completions", json={"messages": HELLO, "max_tokens": 4000}, timeout=30)
    error = assert_openai_error(response, 400, "max_tokens")
    assert error["code"] == "context_length_exceeded"
    assert "2048" in str(error["message"])


TEXT_CASES = [
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "hi", "max_tokens": -5}, "max_tokens"),
]


@pytest.mark.parametrize(("body", "param"), TEXT_CASES, ids=[f"{i}-{p}" for i, (_, p) in enumerate(TEXT_CASES)])
def test_bad_completion_fields_name_the_param(server: Server, body: dict[str, object], param: str) -> None:
    response = loopback.post(f"{server.v1}/completions", json=body, timeout=30)
    assert_openai_error(response, 400, param)


UNSUPPORTED = [
    ("/chat/completions", {"n": 2}, "n"),
    ("/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/chat/completions", {"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ("/chat/completions", {"audio": {"voice": "alloy"}}, "audio"),
    ("/completions", {"echo": True}, "echo"),
    ("/completions", {"suffix": "end"}, "suffix"),
    ("/completions", {"best_of": 3}, "best_of"),
]


@pytest.mark.parametrize(("path", "extra", "param"), UNSUPPORTED, ids=[p for _, _, p in UNSUPPORTED])
def test_unsupported_parameters_are_refused_by_name(
    server: Server, path: str, extra: dict[str, object], param: str
) -> None:
    base: dict[str, object] = {"messages": HELLO} if path == "/chat/completions" else {"prompt": "hi"}
    response = loopback.post(f"{server.v1}{path}", json={**base, **extra}, timeout=30)
    error = assert_openai_error(response, 400, param)
    assert param in str(error["message"])


def test_unknown_fields_and_user_are_ignored(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=2,
        temperature=0,
        user="someone",
        extra_body={"frobnicate": 1},  # type: ignore[arg-type]
    )
    assert completion.choices[0].finish_reason == "length"


def test_sdk_raises_bad_request_with_the_body(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", messages=HELLO, max_tokens=-1)  # type: ignore[arg-type]
    assert caught.value.status_code == 400
    assert caught.value.param == "max_tokens"  # type: ignore[attr-defined]


def test_unknown_path_and_wrong_method_are_json(server: Server) -> None:
    missing = loopback.get(f"{server.v1}/nope", timeout=10)
    assert_openai_error(missing, 404, None)
    wrong = loopback.get(f"{server.v1}/chat/completions", timeout=10)
    assert_openai_error(wrong, 405, None)
    unknown_model = loopback.get(f"{server.v1}/models/not-a-model", timeout=10)
    assert_openai_error(unknown_model, 404, "model")


def test_models_lists_the_served_model_first(server: Server) -> None:
    body = loopback.get(f"{server.v1}/models", timeout=10).json()
    assert body["object"] == "list"
    first = body["data"][0]
    assert first["object"] == "model" and first["context_window"] == 2048
    assert loopback.get(f"{server.v1}/models/{first['id']}", timeout=10).json()["id"] == first["id"]


def test_server_keeps_serving_after_errors(client: openai.OpenAI, server: Server) -> None:
    for content in (b"{", b"[]", b'{"messages": []}'):
        assert post(server, "/chat/completions", content).status_code == 400
    completion = client.chat.completions.create(model="m", messages=HELLO, max_tokens=3, temperature=0)  # type: ignore[arg-type]
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert loopback.get(f"{server.base_url}/health", timeout=10).json()["status"] == "ok"


def test_metrics_follow_the_work(server: Server, client: openai.OpenAI) -> None:
    def generated() -> int:
        response = loopback.get(f"{server.base_url}/metrics", timeout=10)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        (line,) = [
            line for line in response.text.splitlines() if line.startswith("mlx_relay:gateway_generated_tokens_total{")
        ]
        return int(float(line.split()[-1]))

    before = generated()
    client.chat.completions.create(model="m", messages=HELLO, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert generated() == before + 4
