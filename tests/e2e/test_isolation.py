"""One request's bad data fails that request alone (issue 10, repros 1-6, 8, 10).

Each case once killed the engine for good (`/health` 503 `dead`) or made
everyone wait; now each gets its API's 4xx, `/health` stays 200 and a
normal request is served after it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

DEEP = "[" * 1000
HELLO = [{"role": "user", "content": "hi"}]
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/v1/messages/count_tokens"]


def post(server: Server, path: str, body: object | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return loopback.post(
        server.base_url + path, content=content, headers={"content-type": "application/json"}, timeout=60
    )


def assert_still_serving(server: Server) -> None:
    assert loopback.get(f"{server.base_url}/health", timeout=10).status_code == 200
    response = post(server, "/v1/chat/completions", {"model": "m", "messages": HELLO, "max_tokens": 2})
    assert response.status_code == 200, response.text


def assert_bad_request(response: httpx.Response, path: str) -> str:
    """A 400 in the shape of the route's API; its message."""
    assert response.status_code == 400, response.text
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    assert body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    "body", [DEEP, "[" * 1000 + "]" * 1000, '{"a":' * 500 + "1" + "}" * 500], ids=["open", "closed", "objects"]
)
def test_a_body_nested_too_deep_is_a_400(server: Server, path: str, body: str) -> None:
    """Repro 1: json.loads' RecursionError in the parse stage used to end the engine."""
    assert "nests deeper" in assert_bad_request(post(server, path, body), path)
    assert_still_serving(server)


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_deep_chat_tool_call_arguments_are_a_400(server: Server) -> None:
    """Repro 2 (chat): the arguments string is re-read as JSON when the template renders it."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(_nested(900))}}
    messages = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
    ]
    response = post(server, "/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 2})
    assert_bad_request(response, "/v1/chat/completions")
    assert response.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
    assert_still_serving(server)


def test_deep_responses_function_call_arguments_are_a_400(server: Server) -> None:
    """Repro 2 (Responses): a function_call input item's arguments."""
    items = [
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": json.dumps(_nested(900))},
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
    ]
    response = post(server, "/v1/responses", {"model": "m", "input": items, "max_output_tokens": 16})
    assert_bad_request(response, "/v1/responses")
    assert response.json()["error"]["param"] == "input[1].arguments"
    assert_still_serving(server)


def _deep_schema(levels: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize("levels", [150, 200])
def test_a_deep_tool_schema_is_a_400(server: Server, levels: int) -> None:
    """Repro 3: a tool schema 300-400 JSON levels deep overflowed the template's tool rendering."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": _deep_schema(levels)}}]
    response = post(server, "/v1/chat/completions", {"model": "m", "messages": HELLO, "tools": tools, "max_tokens": 2})
    assert_bad_request(response, "/v1/chat/completions")
    anthropic_tools = [{"name": "f", "input_schema": _deep_schema(levels)}]
    body = {"model": "m", "max_tokens": 2, "messages": HELLO, "tools": anthropic_tools}
    assert_bad_request(post(server, "/v1/messages", body), "/v1/messages")
    assert_still_serving(server)


def test_the_disk_tier_folder_replaced_by_a_file_fails_spills_quietly(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """Repro 4: the spill writer's cleanup raised NotADirectoryError and ended the engine."""
    cache = tmp_path / "kv"
    server = server_factory(cache_dir=str(cache), prompt_cache_bytes="4096")
    (folder,) = list(cache.iterdir())
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    folder.write_text("not a folder")
    # Small memory tier: each new prompt evicts the last one to the (broken) disk tier.
    for index in range(6):
        prompt = f"conversation {index} " * 20
        response = post(server, "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2})
        assert response.status_code == 200, response.text
    disk = loopback.get(f"{server.base_url}/stats", timeout=10).json()["prompt_cache"]["disk"]
    assert disk["spill_errors"] >= 1
    assert_still_serving(server)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/messages/count_tokens"])
def test_a_prompt_too_long_by_its_bytes_is_refused_before_tokenizing(server: Server, path: str) -> None:
    """Repro 5: a 7 MB prompt is a fast context_length_exceeded, not minutes of tokenizing."""
    # Just under the default body cap (MLX_RELAY_MAX_BODY_BYTES, 8 MiB).
    text = "word " * (7 * 10**6 // 5)
    body: dict[str, object] = {"model": "m", "max_tokens": 2}
    body.update({"prompt": text} if path == "/v1/completions" else {"messages": [{"role": "user", "content": text}]})
    response = post(server, path, body)
    message = assert_bad_request(response, path)
    assert "context" in message or "too long" in message
    if not path.startswith("/v1/messages"):
        assert response.json()["error"]["code"] == "context_length_exceeded"
    assert_still_serving(server)


def test_a_hundred_thousand_choices_is_a_clean_fast_400(server: Server) -> None:
    """Repro 6: guided_choice with 100k choices held the grammar slot for seconds and returned a Rust backtrace."""
    body = {"model": "m", "messages": HELLO, "max_tokens": 2, "guided_choice": [f"choice {i}" for i in range(100_000)]}
    response = post(server, "/v1/chat/completions", body)
    message = assert_bad_request(response, "/v1/chat/completions")
    assert response.json()["error"]["param"] == "guided_choice"
    assert "panic" not in message and "backtrace" not in message and len(message) < 300
    assert_still_serving(server)


def test_an_error_quotes_only_an_excerpt_of_the_input(server: Server) -> None:
    """Repro 8: 100k out-of-vocabulary logit_bias ids gave a 684 KB 400."""
    bias = {str(10_000 + i): 1 for i in range(100_000)}
    response = post(
        server, "/v1/chat/completions", {"model": "m", "messages": HELLO, "max_tokens": 2, "logit_bias": bias}
    )
    message = assert_bad_request(response, "/v1/chat/completions")
    assert len(response.content) < 1000 and "more" in message
    assert_still_serving(server)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": 123, "messages": HELLO}),
        ("/v1/completions", {"model": 123, "prompt": "hi"}),
        ("/v1/responses", {"model": 123, "input": "hi"}),
        ("/v1/messages", {"model": 123, "max_tokens": 2, "messages": HELLO}),
        ("/v1/messages/count_tokens", {"model": 123, "messages": HELLO}),
    ],
)
def test_a_model_that_is_not_a_string_is_a_400(server: Server, path: str, body: dict[str, object]) -> None:
    """Repro 10: `model: 123` was accepted as if valid."""
    message = assert_bad_request(post(server, path, body), path)
    assert "model" in message
    if not path.startswith("/v1/messages"):
        assert post(server, path, body).json()["error"]["param"] == "model"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**100])
def test_a_seed_past_64_bits_is_a_400(server: Server, path: str, seed: int) -> None:
    """Repro 10: a seed beyond 64 bits was accepted."""
    body: dict[str, object] = {"model": "m", "max_tokens": 2, "seed": seed}
    body.update({"prompt": "hi"} if path == "/v1/completions" else {"messages": HELLO})
    response = post(server, path, body)
    assert_bad_request(response, path)
    assert response.json()["error"]["param"] == "seed"
    ok = post(server, path, {**body, "seed": 2**64 - 1})
    assert ok.status_code == 200, ok.text
