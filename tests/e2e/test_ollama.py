"""Ollama's API through the real `ollama` Python client, as its users call it, against the shared tiny server."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import ollama
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.images import IMAGE_TOKENS, b64, encoded, image_server, picture

# RFC 3339 with nanoseconds in UTC, as Ollama writes `created_at`.
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$")
DONE_FIELDS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count")


@pytest.fixture
def api(server: Server) -> Iterator[ollama.Client]:
    with ollama.Client(host=server.base_url, verify=loopback.TLS) as opened:
        yield opened


def _check_done(part: ollama.ChatResponse | ollama.GenerateResponse, *, limit: int) -> None:
    assert part.done is True and part.done_reason in ("stop", "length")
    assert part.eval_count is not None and 1 <= part.eval_count <= limit
    assert part.prompt_eval_count and part.prompt_eval_count > 0
    assert part.total_duration and part.total_duration >= (part.eval_duration or 0) > 0
    assert all(part[name] is not None for name in DONE_FIELDS)
    assert part.created_at and STAMP.match(part.created_at)


def test_chat_whole_and_streamed(server: Server, api: ollama.Client) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    whole = api.chat(model="tiny", messages=messages, options={"num_predict": 5, "seed": 1})
    assert whole.message.role == "assistant" and isinstance(whole.message.content, str)
    assert whole.model == "tiny"
    _check_done(whole, limit=5)
    parts = list(api.chat(model="tiny", messages=messages, stream=True, options={"num_predict": 5, "seed": 1}))
    assert all(not part.done for part in parts[:-1]) and parts[-1].done
    _check_done(parts[-1], limit=5)
    # A seed makes the same row: streamed pieces join into the whole answer.
    assert "".join(part.message.content or "" for part in parts) == whole.message.content


def test_generate_whole_and_streamed(server: Server, api: ollama.Client) -> None:
    options = {"num_predict": 4, "temperature": 0}
    whole = api.generate(model="tiny", prompt="Once upon", system="Be brief.", options=options)
    _check_done(whole, limit=4)
    parts = list(api.generate(model="tiny", prompt="Once upon", system="Be brief.", options=options, stream=True))
    assert "".join(part.response or "" for part in parts) == whole.response
    raw = api.generate(model="tiny", prompt="Once upon", raw=True, options=options)
    _check_done(raw, limit=4)


def test_num_predict_is_a_length_limit(server: Server, api: ollama.Client) -> None:
    reply = api.generate(model="tiny", prompt="count", options={"num_predict": 3, "temperature": 0})
    assert reply.eval_count == 3 and reply.done_reason == "length"


def test_wire_is_ndjson(server: Server, api: ollama.Client) -> None:
    body = {"model": "tiny", "prompt": "hi", "options": {"num_predict": 3}}
    with loopback.stream("POST", f"{server.base_url}/api/generate", json=body) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["response"] == "" and lines[-1]["eval_count"] == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "options": {"mirostat": 2}}, "options.mirostat"),
        ({"prompt": "x", "options": {"tfs_z": 0.5}}, "options.tfs_z"),
        ({"prompt": "x", "options": {"repeat_last_n": 32}}, "options.repeat_last_n"),
        ({"prompt": "x", "context": [1, 2, 3]}, "context"),
        ({"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
        ({"prompt": "x", "options": {"temperature": "hot"}}, "options.temperature"),
        ({"prompt": "x", "options": {"no_such": 1}}, "options.no_such"),
    ],
)
def test_refusals_name_the_field(api: ollama.Client, body: dict[str, object], param: str) -> None:
    with pytest.raises(ollama.ResponseError) as raised:
        api.generate(model="tiny", **body)  # type: ignore[call-overload]
    assert raised.value.status_code == 400 and param in raised.value.error


def test_error_shape_is_ollamas(server: Server, api: ollama.Client) -> None:
    response = loopback.post(f"{server.base_url}/api/chat", json={"model": "tiny", "messages": "no"})
    assert response.status_code == 400 and set(response.json()) == {"error"}
    assert loopback.get(f"{server.base_url}/api/nothing").json().keys() == {"error"}


def test_prompt_past_num_ctx_is_refused(server: Server, api: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as raised:
        api.generate(model="tiny", prompt="word " * 50, options={"num_ctx": 8})
    assert raised.value.status_code == 400 and "num_ctx" in raised.value.error


def test_num_ctx_holds_prompt_and_reply_together(api: ollama.Client) -> None:
    prompt = "word " * 10
    alone = api.generate(model="tiny", prompt=prompt, options={"num_predict": 1})
    limit = alone.prompt_eval_count + 5
    # Asked for 40 tokens, given the 5 the prompt leaves of num_ctx; Ollama's "length" is the reply's cut.
    held = api.generate(model="tiny", prompt=prompt, options={"num_ctx": limit, "num_predict": 40, "temperature": 0})
    assert held.prompt_eval_count + held.eval_count <= limit and held.eval_count == 5
    assert held.done_reason == "length"


def test_format_schema_gives_matching_json(server: Server, api: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Where?"}]
    reply = api.chat(model="tiny", messages=messages, format=schema, options={"num_predict": 40})
    assert json.loads(reply.message.content or "")["city"] in ("Paris", "Rome")


def test_tools_come_back_with_object_arguments(server: Server, api: ollama.Client) -> None:
    def get_weather(city: str) -> str:
        """Weather in a city.

        Args:
            city: the city
        """
        return "sunny"

    # The forced call is what the tiny model makes: a schema-constrained tool call through the `required` path.
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [ollama._utils.convert_function_to_tool(get_weather).model_dump(exclude_none=True)],
        "options": {"num_predict": 60, "seed": 3},
        "stream": False,
    }
    reply = loopback.post(f"{server.base_url}/api/chat", json=body).json()
    calls = reply["message"].get("tool_calls") or []
    for call in calls:
        assert call["function"]["name"] == "get_weather" and isinstance(call["function"]["arguments"], dict)
    # The history the client sends back, calls and the tool's answer included, is accepted.
    history: list[dict[str, object]] = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
    ]
    again = api.chat(model="tiny", messages=history, tools=[get_weather], options={"num_predict": 3})
    assert again.done


def test_embed_and_embeddings(server: Server, api: ollama.Client) -> None:
    reply = api.embed(model="tiny", input=["hello world", "the sea"])
    assert len(reply.embeddings) == 2 and len(reply.embeddings[0]) > 0
    assert reply.prompt_eval_count and reply.prompt_eval_count > 0
    legacy = api.embeddings(model="tiny", prompt="hello world")
    assert legacy.embedding == pytest.approx(reply.embeddings[0], rel=1e-5)


def test_list_show_ps_version(server: Server, api: ollama.Client) -> None:
    names = [model.model for model in api.list().models]
    assert names and all(isinstance(name, str) for name in names)
    shown = api.show(names[0] or "")
    assert shown.capabilities and "completion" in shown.capabilities
    assert shown.details is not None and shown.details.format == "mlx"
    assert shown.modelinfo is not None and any(key.endswith("context_length") for key in shown.modelinfo)
    running = api.ps().models
    assert running and running[0].context_length and running[0].expires_at is not None
    assert loopback.get(f"{server.base_url}/api/version").json()["version"].count(".") == 2


@pytest.mark.slow
def test_images_reach_the_vision_model(server_factory: ServerFactory) -> None:
    """`images` of chat and generate on `tiny-vl`: the prompt grows by the picture's image tokens."""
    vision = image_server(server_factory)
    picture_b64 = b64(encoded(picture()))
    with ollama.Client(host=vision.base_url, verify=loopback.TLS) as api:
        plain = api.chat(model="tiny-vl", messages=[{"role": "user", "content": "What?"}], options={"num_predict": 1})
        seen = api.chat(
            model="tiny-vl",
            messages=[{"role": "user", "content": "What?", "images": [picture_b64]}],
            options={"num_predict": 1},
        )
        assert (seen.prompt_eval_count or 0) - (plain.prompt_eval_count or 0) >= IMAGE_TOKENS
        generated = api.generate(model="tiny-vl", prompt="What?", images=[picture_b64], options={"num_predict": 1})
        assert (generated.prompt_eval_count or 0) >= IMAGE_TOKENS
        assert "vision" in (api.show("tiny-vl").capabilities or [])


@pytest.mark.slow
def test_keep_alive_zero_unloads_after_the_request(server_factory: ServerFactory) -> None:
    fleet = server_factory(model="tiny,tiny-vl", private=True)
    with ollama.Client(host=fleet.base_url, verify=loopback.TLS) as api:
        api.generate(model="mlx-relay/tiny", prompt="hi", options={"num_predict": 2})
        assert "mlx-relay/tiny" in [model.model for model in api.ps().models]
        api.generate(model="mlx-relay/tiny", prompt="hi", options={"num_predict": 2}, keep_alive=0)
        # Unloaded once its memory is free (until then a request is told to retry), and gone from ps.
        deadline = time.monotonic() + 30
        while _state(fleet, "mlx-relay/tiny") != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "mlx-relay/tiny" not in [model.model for model in api.ps().models]
        # The next request loads it again, as Ollama does.
        assert api.generate(model="mlx-relay/tiny", prompt="hi", options={"num_predict": 2}).done


def _state(server: Server, model: str) -> str:
    cards = loopback.get(f"{server.base_url}/v1/models", timeout=5.0).json()["data"]
    return str(next(card["state"] for card in cards if card["id"] == model))
