"""`GET /openapi.json` describes every route served, and schemathesis finds no 5xx with it.

The fuzz run is bounded (a few examples per operation, tiny `max_tokens`)
so it takes well under a minute on the tiny model.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from tests import loopback
from tests.conftest import Server, ServerFactory
from wire.openapi import OPERATIONS

KEY = "fuzz-key"
_MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@pytest.fixture(scope="module")
def fuzz_server(server_factory: ServerFactory) -> Server:
    return server_factory(api_key=KEY)


def _served_routes() -> set[tuple[str, str]]:
    import app

    routes = set()
    for rule in app.app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        routes |= {(method.lower(), path) for method in rule.methods or () if method not in ("HEAD", "OPTIONS")}
    return routes


def test_every_served_route_is_described(fuzz_server: Server) -> None:
    document = loopback.get(f"{fuzz_server.base_url}/openapi.json", headers={"x-api-key": KEY}, timeout=60).json()
    assert document["openapi"].startswith("3.1")
    described = {(method, path) for path, item in document["paths"].items() for method in item}
    assert described == _served_routes()


def test_request_schemas_come_from_the_decoders(fuzz_server: Server) -> None:
    """Fields the decoders read appear with the types they accept; refused-by-name fields accept only null."""
    document = loopback.get(f"{fuzz_server.base_url}/openapi.json", headers={"x-api-key": KEY}, timeout=60).json()

    def body(path: str) -> dict[str, Any]:
        schema: dict[str, Any] = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        return schema

    chat = body("/v1/chat/completions")
    assert chat["required"] == ["messages"]
    assert chat["properties"]["temperature"]["type"] == ["number", "null"]
    assert chat["properties"]["stream"]["type"] == ["boolean", "null"]
    assert chat["properties"]["functions"]["type"] == "null"  # refused by name: unsupported
    assert chat["properties"]["messages"]["items"]["required"] == ["role", "content"]
    messages = body("/v1/messages")
    assert set(messages["required"]) == {"model", "messages", "max_tokens"}
    assert body("/v1/responses")["properties"]["input"]["type"] == ["string", "array"]
    assert "max_tokens" not in body("/v1/messages/count_tokens").get("required", [])


@pytest.fixture(scope="module")
def served_schema(fuzz_server: Server) -> Any:
    return schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json", headers={"x-api-key": KEY})


def _bounded(case: Any) -> None:
    # Generation length is the one cost the schema leaves open: keep each example to a few tokens.
    if isinstance(case.body, dict):
        if not any(case.body.get(field) is not None for field in _MAX_TOKEN_FIELDS):
            case.body["max_output_tokens" if case.path == "/v1/responses" else "max_tokens"] = 4
        for field in _MAX_TOKEN_FIELDS:
            if isinstance(case.body.get(field), int) and not isinstance(case.body[field], bool):
                case.body[field] = max(-1, min(case.body[field], 4))


# schemathesis's own pytest plugin does not run under pytest 9, so each operation is driven with @given here.
@pytest.mark.slow
@pytest.mark.parametrize(("method", "path"), [(op.method, op.path) for op in OPERATIONS], ids=lambda v: str(v))
def test_generated_requests_never_get_a_5xx(served_schema: Any, fuzz_server: Server, method: str, path: str) -> None:
    """Whatever schemathesis sends within the described shapes: a 2xx or a 4xx, and /health stays 200."""
    operation = served_schema[path][method.upper()]

    @given(case=operation.as_strategy())
    @settings(
        max_examples=12,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        _bounded(case)
        response = case.call(base_url=fuzz_server.base_url, headers={"x-api-key": KEY}, timeout=60)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
        assert loopback.get(f"{fuzz_server.base_url}/health", timeout=10).status_code == 200

    check()
