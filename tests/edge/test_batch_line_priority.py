"""A batch line's generation runs at idle priority, and a client's request never does (edge/batch_calls.py)."""

from __future__ import annotations

import json

import anyio
import pytest
from quart import Quart, Response, jsonify, request

from edge.batch_calls import run_line, with_line_priority
from pipeline.requests import GenerationParams, JsonValue, Sampling, TextRequest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def decode(value: JsonValue) -> TextRequest:
    assert isinstance(value, dict)
    return TextRequest(prompt=str(value["prompt"]), params=GenerationParams(max_tokens=1, sampling=Sampling()))


def echo_app() -> Quart:
    """A route that decodes its body as the generation routes do, and says whether the request came out idle."""
    app = Quart(__name__)

    @app.post("/v1/completions")
    async def completions() -> Response:
        body = json.loads(await request.get_data(as_text=False))
        return jsonify({"idle": with_line_priority(decode)(body).params.idle})

    return app


async def test_a_batch_line_is_decoded_at_idle_priority() -> None:
    result = await run_line(echo_app(), "/v1/completions", {"prompt": "hi"}, anyio.Event(), "batch_req_1")
    assert result.status == 200 and json.loads(result.body) == {"idle": True}


async def test_a_clients_request_is_not_idle_whatever_its_body_says() -> None:
    client = echo_app().test_client()
    reply = await client.post("/v1/completions", json={"prompt": "hi", "idle": True, "priority": "batch"})
    assert reply.status_code == 200 and await reply.get_json() == {"idle": False}
