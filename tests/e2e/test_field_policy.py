"""Unknown request fields, one policy on every API (`wire/field_policy.py`): served, named in the
`x-mlx-relay-ignored-fields` header and logged once; a 400 naming them in strict mode. Anthropic's
structured-outputs beta field `output_format` is honoured as `output_config.format`."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": {"messages": USER, "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"messages": USER, "max_tokens": 2},
    "/v1/messages/count_tokens": {"messages": USER},
    "/v1/embeddings": {"input": "hi"},
}
HEADER = "x-mlx-relay-ignored-fields"


@pytest.fixture(scope="module")
def strict_server(server_factory: ServerFactory) -> Server:
    return server_factory(strict_fields="1")


@pytest.mark.parametrize("path", sorted(BODIES))
def test_unknown_fields_are_served_and_named_in_a_header(server: Server, path: str) -> None:
    body = {"model": "m", **BODIES[path], "bogus_field": 1, "another_one": {"x": 1}, "user": "u"}
    response = loopback.post(server.base_url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers[HEADER] == "another_one, bogus_field"
    known = loopback.post(server.base_url + path, json={"model": "m", **BODIES[path]}, timeout=60)
    assert known.status_code == 200 and HEADER not in known.headers


def test_unknown_fields_are_logged_once_per_request(server: Server) -> None:
    body = {"model": "m", **BODIES["/v1/chat/completions"], "logged_field_a7": True}
    with loopback.stream(
        "POST", f"{server.v1}/chat/completions", json={**body, "stream": True}, timeout=60
    ) as response:
        assert response.headers[HEADER] == "logged_field_a7"
        response.read()
    lines = [line for line in server.logs().splitlines() if "logged_field_a7" in line]
    assert len(lines) == 1 and "request.fields_ignored" in lines[0]


@pytest.mark.parametrize("path", sorted(BODIES))
def test_strict_mode_refuses_unknown_fields_by_name(strict_server: Server, path: str) -> None:
    response = loopback.post(
        strict_server.base_url + path, json={"model": "m", **BODIES[path], "bogus_field": 1}, timeout=60
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "'bogus_field'" in error["message"]
    if path.startswith("/v1/messages"):
        assert response.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["param"] == "bogus_field"
    assert (
        loopback.post(
            strict_server.base_url + path, json={"model": "m", **BODIES[path], "user": "u"}, timeout=60
        ).status_code
        == 200
    )


ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def test_output_format_beta_field_constrains_the_answer(server: Server) -> None:
    output_format = {"type": "json_schema", "schema": ANSWER}
    body = {"model": "m", "messages": USER, "max_tokens": 60, "output_format": output_format}
    for _ in range(3):
        response = loopback.post(f"{server.base_url}/v1/messages", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert HEADER not in response.headers
        [block] = response.json()["content"]
        jsonschema.validate(json.loads(block["text"]), ANSWER)
