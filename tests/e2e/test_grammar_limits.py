"""A constraint the grammar engine cannot hold is a 400 naming the field and the limit, never a 200 that breaks it.

Each case once returned 200 with `finish_reason: stop` and text that did
not match, its only trace llguidance's warnings on stderr. Now the compile
walks a few tokens down the grammar, where these limits show, and the
reason goes to the structured log.
"""

from __future__ import annotations

import json

import pytest

from tests import loopback
from tests.conftest import Server

HELLO = [{"role": "user", "content": "hi"}]
RECURSIVE = {
    "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}},
    "$ref": "#/$defs/node",
}
ALTERNATIVES = "start: " + " | ".join(json.dumps(f"w{i}") for i in range(6000))
CASES = [
    pytest.param({"guided_grammar": ALTERNATIVES}, "guided_grammar", "max is 2000", id="6000-alternatives"),
    pytest.param(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "node", "schema": RECURSIVE}}},
        "response_format",
        "limit 50000",
        id="recursive-required-ref",
    ),
    pytest.param({"guided_regex": "a{1000000}"}, "guided_regex", "fuel", id="a{1000000}"),
    pytest.param({"guided_regex": "((a{64}){64}){64}"}, "guided_regex", "fuel", id="((a{64}){64}){64}"),
    pytest.param({"guided_grammar": "start: a\na: a"}, "guided_grammar", "matches no text", id="lark-a-is-a"),
]


@pytest.mark.parametrize(("extra", "param", "limit"), CASES)
def test_a_grammar_past_a_limit_is_a_400_naming_field_and_limit(
    server: Server, extra: dict[str, object], param: str, limit: str
) -> None:
    body = {"model": "m", "messages": HELLO, "max_tokens": 8, **extra}
    response = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param) and error["code"] == "invalid_grammar", error
    assert limit in error["message"], error["message"]


def test_llguidance_speaks_through_the_structured_log(server: Server) -> None:
    """Its warnings no longer reach stderr as bare lines; the refusal is a structured event."""
    body = {"model": "m", "messages": HELLO, "max_tokens": 8, "guided_regex": "a{1000000}"}
    assert loopback.post(f"{server.v1}/chat/completions", json=body, timeout=60).status_code == 400
    logs = server.logs()
    assert "constraint.refused" in logs
    assert not [line for line in logs.splitlines() if line.startswith("Warning: ")]


def test_a_grammar_within_the_limits_still_holds(server: Server) -> None:
    body = {"model": "m", "messages": HELLO, "max_tokens": 12, "guided_regex": "(yes|no) [0-9]{3}"}
    response = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] in {f"{w} {n:03d}" for w in ("yes", "no") for n in range(1000)}
