"""Generated bodies against every POST route of a real server: no 5xx, ever.

Hypothesis builds bodies around each API's real fields (valid values,
wrong types, odd numbers, unicode, nesting) and raw texts that are not
JSON at all. After each one: the status is 2xx or 4xx, and `/health` is
200; at the end a normal request is still served. The runs are
derandomized and bounded, so the suite is repeatable and quick.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Server

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hi"}]
SETTINGS = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from([2**64, -(2**63) - 1, 10**400, 1e308, -0.0, "", "\u0000", "\ud7ff\uffff", "🙂" * 50])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "wizard"])},
        optional={"content": st.text(max_size=40) | json_values, "tool_calls": json_values, "name": json_values},
    ),
    max_size=3,
)
tools = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.text(min_size=1, max_size=8)}, optional={"parameters": json_values}
            ),
        }
    ),
    max_size=2,
)

COMMON = {
    "model": st.just("m") | json_values,
    "temperature": st.floats(-1, 3) | json_values,
    "top_p": st.floats(-1, 2) | json_values,
    "stop": st.lists(st.text(max_size=4), max_size=3) | json_values,
    "stream": st.booleans() | json_values,
    "metadata": json_values,
}
FIELDS = {
    "/v1/chat/completions": {
        **COMMON,
        "messages": messages | json_values,
        "tools": tools | json_values,
        "tool_choice": json_values,
        "seed": st.integers() | json_values,
        "logit_bias": st.dictionaries(st.integers(-5, 5000).map(str), st.floats(-200, 200)),
        "response_format": json_values,
        "guided_choice": st.lists(st.text(max_size=6), max_size=5) | json_values,
        "guided_regex": st.text(max_size=12),
        "logprobs": json_values,
        "top_logprobs": json_values,
        "n": json_values,
    },
    "/v1/completions": {
        **COMMON,
        "prompt": st.text(max_size=60) | st.lists(st.integers(-3, 5000), max_size=8) | json_values,
        "seed": st.integers() | json_values,
        "echo": json_values,
        "logprobs": json_values,
    },
    "/v1/responses": {
        **COMMON,
        "input": st.text(max_size=40) | messages | json_values,
        "instructions": json_values,
        "tools": json_values,
        "text": json_values,
        "previous_response_id": json_values,
        "store": json_values,
    },
    "/v1/messages": {
        **COMMON,
        "messages": messages | json_values,
        "system": json_values,
        "tools": json_values,
        "tool_choice": json_values,
        "thinking": json_values,
    },
    "/v1/messages/count_tokens": {"model": COMMON["model"], "messages": messages | json_values, "system": json_values},
}
# Keeps a body that happens to be valid short: these fields are set after generating.
SHORT = {"max_tokens": 3, "max_completion_tokens": 3, "max_output_tokens": 16}


def bodies(path: str) -> st.SearchStrategy[str]:
    fields = FIELDS[path]
    objects = st.fixed_dictionaries({}, optional=fields).map(lambda body: json.dumps({**body, **_short(path)}))
    raw = (
        st.text(max_size=60)
        | st.integers(1, 3000).map(lambda n: "[" * n)
        | st.integers(1, 3000).map(lambda n: '{"a":' * n + "1" + "}" * n)
        | json_values.map(json.dumps)
    )
    return objects | raw


def _short(path: str) -> dict[str, int]:
    if path == "/v1/messages/count_tokens":
        return {}
    if path == "/v1/responses":
        return {"max_output_tokens": SHORT["max_output_tokens"]}
    return {"max_tokens": SHORT["max_tokens"]}


def check(client: httpx.Client, path: str, body: str) -> None:
    response = client.post(
        path, content=body.encode(errors="surrogatepass"), headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (body[:300], response.text[:500])
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("path", list(FIELDS))
def test_generated_bodies_never_get_a_5xx(server: Server, path: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:

        @SETTINGS
        @given(body=bodies(path))
        def run(body: str) -> None:
            check(client, path, body)

        run()
        normal = client.post("/v1/chat/completions", json={"model": "m", "messages": HELLO, "max_tokens": 2})
        assert normal.status_code == 200, normal.text
