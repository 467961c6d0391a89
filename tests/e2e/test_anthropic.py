"""Anthropic Messages through the real `anthropic` SDK and raw HTTP."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

USER = [{"role": "user", "content": "Say hello."}]
# Current Anthropic SDKs no longer send sampling fields; the API still takes them.
GREEDY = {"temperature": 0}


@pytest.fixture
def claude(server: Server) -> anthropic.Anthropic:
    return server.anthropic_client()


def sse(server: Server, body: dict[str, object]) -> list[tuple[str, dict[str, object]]]:
    """(event name, data) pairs of a streamed Messages response."""
    pairs: list[tuple[str, dict[str, object]]] = []
    with loopback.stream("POST", f"{server.v1}/messages", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name
                pairs.append((name, data))
    return pairs


def test_create_returns_a_message(claude: anthropic.Anthropic, server: Server) -> None:
    message = claude.messages.create(model="m", max_tokens=8, messages=USER, extra_body=GREEDY)  # type: ignore[arg-type]
    assert message.id.startswith("msg_")
    assert message.type == "message" and message.role == "assistant"
    # Any model name is served by the one model, and echoed as asked.
    assert message.model == "m"
    assert [block.type for block in message.content] == ["text"]
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    counted = claude.messages.count_tokens(model="m", messages=USER)  # type: ignore[arg-type]
    # Anthropic reports cache reads apart from input tokens; together they are the prompt.
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == counted.input_tokens > 0
    assert message.usage.output_tokens == 8


def test_stream_follows_the_event_grammar(server: Server, claude: anthropic.Anthropic) -> None:
    body = {"model": "m", "max_tokens": 12, "messages": USER, **GREEDY}
    events = sse(server, body)
    names = [name for name, _ in events if name != "ping"]
    assert names[0] == "message_start"
    assert names[1] == "content_block_start"
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert isinstance(start, dict) and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0  # type: ignore[index]
    delta = next(data for name, data in events if name == "message_delta")
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 12  # type: ignore[index]
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")  # type: ignore[index]
    whole = claude.messages.create(model="m", max_tokens=12, messages=USER, extra_body=GREEDY)  # type: ignore[arg-type]
    assert text == whole.content[0].text  # type: ignore[union-attr]


def test_sdk_stream_helper_accumulates_the_message(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="m", max_tokens=10, messages=USER, extra_body=GREEDY) as stream:  # type: ignore[arg-type]
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == streamed  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10


def test_stop_sequences(claude: anthropic.Anthropic) -> None:
    free = claude.messages.create(model="m", max_tokens=40, messages=USER, extra_body=GREEDY)  # type: ignore[arg-type]
    text = free.content[0].text  # type: ignore[union-attr]
    stop = text[10:14]
    cut = claude.messages.create(model="m", max_tokens=40, messages=USER, extra_body=GREEDY, stop_sequences=[stop])  # type: ignore[arg-type]
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop


def test_system_as_string_or_blocks(claude: anthropic.Anthropic) -> None:
    plain = claude.messages.count_tokens(model="m", messages=USER)  # type: ignore[arg-type]
    as_string = claude.messages.count_tokens(model="m", system="Be terse.", messages=USER)  # type: ignore[arg-type]
    as_blocks = claude.messages.count_tokens(
        model="m",
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "terse."}],
        messages=USER,  # type: ignore[arg-type]
    )
    assert as_string.input_tokens == as_blocks.input_tokens > plain.input_tokens


def test_tool_turns_render_like_openai(claude: anthropic.Anthropic, client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    counted = claude.messages.count_tokens(
        model="m",
        tools=[{"name": "get_weather", "description": "Weather for a city", "input_schema": schema}],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        ],  # type: ignore[list-item]
    )
    chat = client.chat.completions.create(
        model="m",
        max_tokens=1,
        tools=[
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "Weather for a city", "parameters": schema},
            }
        ],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        ],  # type: ignore[list-item]
    )
    assert chat.usage is not None and counted.input_tokens == chat.usage.prompt_tokens


def test_thinking_switch_reaches_the_template(claude: anthropic.Anthropic) -> None:
    on = claude.messages.count_tokens(model="m", messages=USER, thinking={"type": "enabled", "budget_tokens": 1024})  # type: ignore[arg-type]
    off = claude.messages.count_tokens(model="m", messages=USER, thinking={"type": "disabled"})  # type: ignore[arg-type]
    assert off.input_tokens > on.input_tokens  # "disabled" adds the template's empty think block


def test_prefill_inside_think_yields_a_thinking_block(server: Server, claude: anthropic.Anthropic) -> None:
    messages = [*USER, {"role": "assistant", "content": "<think>\n"}]
    message = claude.messages.create(model="m", max_tokens=10, messages=messages, extra_body=GREEDY)  # type: ignore[arg-type]
    assert [block.type for block in message.content] == ["thinking"]
    assert message.content[0].thinking  # type: ignore[union-attr]
    events = sse(server, {"model": "m", "max_tokens": 10, "messages": messages, "temperature": 0})
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts == [{"type": "thinking", "thinking": "", "signature": ""}]
    kinds = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]  # type: ignore[index]
    assert set(kinds[:-1]) == {"thinking_delta"} and kinds[-1] == "signature_delta"


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    return str(body["error"]["message"])


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "messages": USER}, "max_tokens"),
        ({"model": "m", "max_tokens": 0, "messages": USER}, "max_tokens"),
        ({"model": "m", "max_tokens": 5}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "role"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                            }
                        ],
                    }
                ],
            },
            "image",
        ),
        ({"model": "m", "max_tokens": 5, "messages": USER, "temperature": 1.5}, "temperature"),
        ({"model": "m", "max_tokens": 5, "messages": USER, "stop_sequences": "x"}, "stop_sequences"),
        (
            {"model": "m", "max_tokens": 5, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "w"}]},
            "tools.0.type",
        ),
        ({"max_tokens": 5, "messages": USER}, "model"),
        # A large max_tokens is cut to fit the window; a prompt past the window is not.
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 3000}]}, "context"),
    ],
    ids=[
        "no-max-tokens",
        "zero-max-tokens",
        "no-messages",
        "bad-role",
        "image",
        "temperature",
        "stops",
        "server-tool",
        "no-model",
        "context",
    ],
)
def test_bad_requests_use_anthropic_errors(server: Server, body: dict[str, object], needle: str) -> None:
    message = anthropic_error(
        loopback.post(f"{server.v1}/messages", json=body, timeout=30), 400, "invalid_request_error"
    )
    assert needle in message


def test_invalid_json_and_unknown_path(server: Server) -> None:
    bad = loopback.post(f"{server.v1}/messages", content=b"{", headers={"content-type": "application/json"}, timeout=30)
    anthropic_error(bad, 400, "invalid_request_error")
    anthropic_error(loopback.get(f"{server.v1}/messages/nope", timeout=30), 404, "not_found_error")


def test_sdk_sees_bad_request(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": []}])  # type: ignore[arg-type]


def test_headers_are_tolerated(server: Server) -> None:
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "tools-2024-04-04", "x-api-key": "k"}
    response = loopback.post(
        f"{server.v1}/messages",
        json={"model": "m", "max_tokens": 2, "messages": USER, **GREEDY},
        headers=headers,
        timeout=30,
    )
    assert response.status_code == 200 and response.json()["usage"]["output_tokens"] == 2


def test_overload_is_529(server_factory: ServerFactory) -> None:
    busy = server_factory(max_batch="1", max_pending="0", admission_timeout="0")
    # Greedy, so no chance EOS ends the row that holds the only slot.
    hold = {"model": "m", "max_tokens": 1900, "messages": USER, "stream": True, **GREEDY}
    with loopback.stream("POST", f"{busy.v1}/messages", json=hold, timeout=60) as holder:
        lines = holder.iter_lines()
        next(lines)
        refused = loopback.post(
            f"{busy.v1}/messages", json={"model": "m", "max_tokens": 2, "messages": USER}, timeout=30
        )
        anthropic_error(refused, 529, "overloaded_error")
        assert "retry-after" in refused.headers
