"""The HTTP edge against a real server: keys, CORS, JSON-only bodies, body caps and timeouts, trace ids."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import anthropic
import httpx
import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

KEY = "sk-relay-test-key"
OTHER_KEY = "second-key"
ORIGIN = "https://app.example"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
MESSAGES = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def keyed(server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> Server:
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    key_file.write_text(f"# comment\n{KEY}\n\n{OTHER_KEY}\n")
    return server_factory(
        api_key=f"@{key_file}",
        cors_origins=ORIGIN,
        max_body_bytes="4096",
        body_timeout="1",
        response_store=f"sqlite:///{tmp_path_factory.mktemp('store') / 'responses.db'}",
    )


def _openai(server: Server, key: str) -> openai.OpenAI:
    client = openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0)
    server.clients.append(client)
    return client


def _anthropic(server: Server, key: str) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0)
    server.clients.append(client)
    return client


def test_the_openai_sdk_authenticates_with_its_api_key(keyed: Server) -> None:
    """The SDK's ordinary api_key (sent as a Bearer token) is accepted, a wrong one is a 401 it understands."""
    done = _openai(keyed, KEY).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert done.choices[0].finish_reason in ("length", "stop")
    assert _openai(keyed, OTHER_KEY).models.list().data
    with pytest.raises(openai.AuthenticationError) as refused:
        _openai(keyed, "wrong").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "message": "Incorrect API key provided",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }


def test_the_anthropic_sdk_authenticates_with_its_api_key(keyed: Server) -> None:
    """The Anthropic SDK's api_key (sent as x-api-key) is accepted; a wrong one is its AuthenticationError."""
    message = _anthropic(keyed, KEY).messages.create(**MESSAGES)  # type: ignore[arg-type]
    assert message.stop_reason in ("max_tokens", "end_turn")
    with pytest.raises(anthropic.AuthenticationError) as refused:
        _anthropic(keyed, "wrong").messages.create(**MESSAGES)  # type: ignore[arg-type]
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided"},
    }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models"),
        ("GET", "/stats"),
        ("GET", "/fit"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/messages/count_tokens"),
        ("GET", "/v1/responses/resp_x"),
        ("DELETE", "/v1/responses/resp_x"),
        ("GET", "/no/such/route"),
    ],
)
def test_every_route_but_health_needs_the_key(keyed: Server, method: str, path: str) -> None:
    """No key is a 401 before the route runs (an unknown route too: it tells nothing about what exists)."""
    response = loopback.request(method, keyed.base_url + path, json=CHAT if method == "POST" else None, timeout=30)
    assert response.status_code == 401
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["error"]["type"] == "authentication_error"
    else:
        assert body["error"]["type"] == "invalid_request_error" and "API key" in body["error"]["message"]
    assert loopback.get(f"{keyed.base_url}/health", timeout=10).status_code == 200


def test_a_key_in_either_header_is_accepted(keyed: Server) -> None:
    for headers in ({"authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {OTHER_KEY}"}, {"x-api-key": KEY}):
        assert loopback.get(f"{keyed.v1}/models", headers=headers, timeout=10).status_code == 200
    for headers in ({"authorization": KEY}, {"authorization": f"Bearer {KEY}x"}, {"x-api-key": KEY[:-1]}):
        assert loopback.get(f"{keyed.v1}/models", headers=headers, timeout=10).status_code == 401


def test_stats_and_fit_show_no_file_paths(keyed: Server, tiny_model: Path) -> None:
    """The store file, the model folder and the home directory appear in neither report."""
    for path in ("/stats", "/fit", "/metrics"):
        response = loopback.get(keyed.base_url + path, headers={"x-api-key": KEY}, timeout=30)
        assert response.status_code == 200
        for secret in (str(tiny_model), str(Path.home()), "/tmp", "responses.db/"):
            assert secret not in response.text, (path, secret)
    stats = loopback.get(f"{keyed.base_url}/stats", headers={"x-api-key": KEY}, timeout=30).json()
    assert stats["response_store"]["location"] == "responses.db"


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]
)
@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]
)
def test_generation_routes_take_only_json(keyed: Server, path: str, content_type: str | None) -> None:
    """A body a web page can POST cross-site without a preflight is a 415, in the route's error shape."""
    headers = {"x-api-key": KEY} | ({"content-type": content_type} if content_type else {})
    response = loopback.post(keyed.base_url + path, content=json.dumps(CHAT).encode(), headers=headers, timeout=30)
    assert response.status_code == 415
    body = response.json()
    assert (
        (body["type"] == "error")
        if path.startswith("/v1/messages")
        else ("error" in body and body["error"]["param"] is None)
    )


def test_json_with_a_charset_is_json(keyed: Server) -> None:
    headers = {"x-api-key": KEY, "content-type": "application/json; charset=utf-8"}
    response = loopback.post(
        f"{keyed.v1}/chat/completions", content=json.dumps(CHAT).encode(), headers=headers, timeout=30
    )
    assert response.status_code == 200


def test_a_declared_body_over_the_cap_is_413(keyed: Server) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    for path in ("/v1/chat/completions", "/v1/messages"):
        response = loopback.post(keyed.base_url + path, json=body, headers={"x-api-key": KEY}, timeout=30)
        assert response.status_code == 413
        assert "4096 bytes" in response.text


def test_a_streamed_body_over_the_cap_is_413(keyed: Server) -> None:
    """Chunked, with no length declared: refused once the bytes read pass the cap."""

    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    headers = {"x-api-key": KEY, "content-type": "application/json"}
    response = loopback.post(f"{keyed.v1}/chat/completions", content=chunks(), headers=headers, timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_body_that_does_not_arrive_is_408(keyed: Server) -> None:
    """A client that declares 100 bytes and sends 10 is answered 408 after the body timeout (1 s here)."""
    address = urlsplit(keyed.base_url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"x-api-key: {KEY}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"messages'
        )
        reply = _read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"invalid_request_error"' in reply
    assert loopback.get(f"{keyed.base_url}/health", timeout=10).status_code == 200


def _read_reply(sock: socket.socket) -> bytes:
    data = b""
    deadline = time.monotonic() + 30
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        if time.monotonic() > deadline:
            break
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_a_plain_trace_id_is_echoed_and_a_long_one_is_not(keyed: Server) -> None:
    headers = {"x-api-key": KEY}
    echoed = loopback.post(
        f"{keyed.v1}/chat/completions", json=CHAT, headers=headers | {"x-request-id": "trace-42"}, timeout=30
    )
    assert echoed.headers["x-request-id"] == "trace-42"
    for sent in ("a" * 3000, "bad id\twith spaces", "a" * 129):
        response = loopback.post(
            f"{keyed.v1}/chat/completions", json=CHAT, headers=headers | {"x-request-id": sent}, timeout=30
        )
        assert response.status_code == 200
        assert response.headers["x-request-id"].startswith("chatcmpl-")


def test_a_60_kb_trace_id_is_never_reflected(keyed: Server) -> None:
    sent = "a" * 60_000
    try:
        response = loopback.post(
            f"{keyed.v1}/chat/completions", json=CHAT, headers={"x-api-key": KEY, "x-request-id": sent}, timeout=30
        )
    except httpx.TransportError:
        pass  # the server may drop a request whose headers are this large; either way nothing is echoed
    else:
        assert sent not in response.headers.get("x-request-id", "")
        assert len(response.content) < 10_000
    assert loopback.get(f"{keyed.base_url}/health", timeout=10).status_code == 200


def test_cors_preflight_is_answered_for_listed_origins_only(keyed: Server) -> None:
    preflight = {
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
    }
    allowed = httpx.options(f"{keyed.v1}/chat/completions", headers=preflight | {"origin": ORIGIN}, timeout=10)
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    allowed_headers = [name.strip() for name in allowed.headers["access-control-allow-headers"].split(",")]
    assert {"authorization", "content-type", "x-api-key", "anthropic-version", "x-stainless-os"} <= set(allowed_headers)
    other = httpx.options(
        f"{keyed.v1}/chat/completions", headers=preflight | {"origin": "https://evil.example"}, timeout=10
    )
    assert "access-control-allow-origin" not in other.headers
    response = loopback.get(f"{keyed.v1}/models", headers={"origin": ORIGIN, "x-api-key": KEY}, timeout=10)
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in response.headers["access-control-expose-headers"]
    foreign = loopback.get(
        f"{keyed.v1}/models", headers={"origin": "https://evil.example", "x-api-key": KEY}, timeout=10
    )
    assert "access-control-allow-origin" not in foreign.headers


def test_an_open_server_sends_no_cors_headers(server: Server) -> None:
    """With no origins configured, no browser origin is allowed, preflight or not."""
    preflight = {"origin": ORIGIN, "access-control-request-method": "POST"}
    response = httpx.options(f"{server.v1}/chat/completions", headers=preflight, timeout=10)
    assert "access-control-allow-origin" not in response.headers
    response = loopback.post(f"{server.v1}/chat/completions", json=CHAT, headers={"origin": ORIGIN}, timeout=30)
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers
    plain = loopback.post(
        f"{server.v1}/chat/completions",
        content=json.dumps(CHAT).encode(),
        headers={"content-type": "text/plain"},
        timeout=30,
    )
    assert plain.status_code == 415


def test_a_preflight_answers_its_allow_list_not_what_it_was_asked(keyed: Server) -> None:
    asked = {"access-control-request-method": "POST", "access-control-request-headers": "authorization, x-evil-header"}
    allowed = httpx.options(f"{keyed.v1}/chat/completions", headers=asked | {"origin": ORIGIN}, timeout=10)
    assert allowed.status_code == 204
    assert "x-evil-header" not in allowed.headers["access-control-allow-headers"]


@pytest.mark.parametrize(
    ("headers", "code"),
    [({}, "missing_api_key"), ({"authorization": "Bearer wrong"}, "invalid_api_key")],
    ids=["missing", "wrong"],
)
def test_both_401s_have_a_code_and_messages_keeps_anthropics_shape(
    keyed: Server, headers: dict[str, str], code: str
) -> None:
    openai_style = loopback.post(f"{keyed.v1}/chat/completions", json=CHAT, headers=headers, timeout=10)
    assert openai_style.status_code == 401
    error = openai_style.json()["error"]
    assert error == {"message": error["message"], "type": "invalid_request_error", "param": None, "code": code}
    anthropic_style = loopback.post(f"{keyed.v1}/messages", json=MESSAGES, headers=headers, timeout=10)
    assert anthropic_style.status_code == 401
    body = anthropic_style.json()
    assert body == {"type": "error", "error": {"type": "authentication_error", "message": body["error"]["message"]}}


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_body_not_in_utf8_is_a_400(keyed: Server, encoding: str, path: str) -> None:
    body = json.dumps(MESSAGES if path == "/v1/messages" else CHAT).encode(encoding)
    headers = {"x-api-key": KEY, "content-type": "application/json"}
    response = loopback.post(keyed.base_url + path, content=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    assert ("UTF-8" in response.text) or ("not valid JSON" in response.text)
