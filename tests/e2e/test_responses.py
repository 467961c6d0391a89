"""OpenAI Responses through the real `openai` SDK, raw HTTP, and the store."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory


def events_of(server: Server, body: dict[str, object]) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    with loopback.stream("POST", f"{server.v1}/responses", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == name
                events.append(event)
    return events


def test_create_returns_a_response_object(client: openai.OpenAI) -> None:
    response = client.responses.create(model="m", input="Say hello.", max_output_tokens=8, temperature=0)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant"  # type: ignore[union-attr]
    assert response.output_text == item.content[0].text  # type: ignore[union-attr]
    assert response.usage is not None
    assert response.usage.output_tokens == 8
    assert response.usage.total_tokens == response.usage.input_tokens + 8
    assert 0 <= response.usage.input_tokens_details.cached_tokens < response.usage.input_tokens
    assert response.max_output_tokens == 8 and response.store is True


def test_stream_event_chain(server: Server, client: openai.OpenAI) -> None:
    body = {"model": "m", "input": "Say hello.", "max_output_tokens": 6, "temperature": 0}
    events = events_of(server, body)
    types = [str(event["type"]) for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    text = "".join(str(e["delta"]) for e in events if e["type"] == "response.output_text.delta")
    assert events[-4]["text"] == text
    final = events[-1]["response"]
    assert isinstance(final, dict) and final["status"] == "incomplete" and final["output_text"] == text
    assert client.responses.create(**body).output_text == text  # type: ignore[arg-type]


def test_sdk_stream_iterates_typed_events(client: openai.OpenAI) -> None:
    with client.responses.stream(model="m", input="Hi", max_output_tokens=5, temperature=0) as stream:
        seen = [event.type for event in stream]
    assert seen[0] == "response.created" and seen[-1] == "response.incomplete"


def test_three_turns_chain_with_previous_response_id(client: openai.OpenAI, server: Server) -> None:
    first = client.responses.create(
        model="m", input="One.", instructions="Be brief.", max_output_tokens=4, temperature=0
    )
    second = client.responses.create(
        model="m", input="Two.", previous_response_id=first.id, max_output_tokens=4, temperature=0
    )
    third = client.responses.create(
        model="m", input="Three.", previous_response_id=second.id, max_output_tokens=4, temperature=0
    )
    assert second.previous_response_id == first.id and third.previous_response_id == second.id
    # Instructions carry forward, and each turn replays everything before it.
    assert third.instructions == "Be brief."
    assert first.usage and second.usage and third.usage
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    # The same conversation sent whole costs the same prompt.
    whole = client.responses.create(
        model="m",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "One."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Two."},
            {"role": "assistant", "content": second.output_text},
            {"role": "user", "content": "Three."},
        ],
        max_output_tokens=4,
        temperature=0,
    )
    assert whole.usage is not None and whole.usage.input_tokens == third.usage.input_tokens
    assert whole.output_text == third.output_text


def test_get_and_delete_a_stored_response(client: openai.OpenAI) -> None:
    created = client.responses.create(model="m", input="Keep me.", max_output_tokens=3, temperature=0)
    fetched = client.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    items = client.responses.input_items.list(created.id)
    assert [item.type for item in items.data] == ["message"]
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(created.id)


def test_store_false_leaves_nothing_behind(client: openai.OpenAI, server: Server) -> None:
    before = loopback.get(f"{server.base_url}/stats", timeout=10).json()["response_store"]["entries"]
    created = client.responses.create(model="m", input="Forget me.", max_output_tokens=3, store=False)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="More.", previous_response_id=created.id, max_output_tokens=2)
    assert loopback.get(f"{server.base_url}/stats", timeout=10).json()["response_store"]["entries"] == before


def test_unknown_previous_id_is_404_in_openai_shape(server: Server) -> None:
    response = loopback.post(
        f"{server.v1}/responses", json={"input": "x", "previous_response_id": "resp_doesnotexist"}, timeout=30
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["param"] == "previous_response_id" and "resp_doesnotexist" in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": 5}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": "x", "previous_response_id": "not-an-id"}, "previous_response_id"),
        # Malformed input is reported before the (unknown) id is looked up.
        ({"input": 7, "previous_response_id": "resp_unknown"}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        # OpenAI's rule: a background response is read back from the store.
        ({"input": "x", "background": True, "store": False}, "background"),
        ({"input": "x", "reasoning": {"effort": "lots"}}, "reasoning.effort"),
    ],
    ids=[
        "missing",
        "number",
        "empty",
        "role",
        "image",
        "reference",
        "bad-id",
        "input-before-lookup",
        "max",
        "temp",
        "background",
        "effort",
    ],
)
def test_bad_requests(server: Server, body: dict[str, object], param: str) -> None:
    response = loopback.post(f"{server.v1}/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_function_tools_and_outputs_round_trip(client: openai.OpenAI) -> None:
    tool = {
        "type": "function",
        "name": "lookup",
        "description": "Look up",
        "parameters": {"type": "object", "properties": {}},
    }
    response = client.responses.create(
        model="m",
        input=[
            {"role": "user", "content": "Find it."},
            {"type": "function_call", "call_id": "call_9", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_9", "output": "found"},
        ],
        tools=[tool, {"type": "web_search"}],  # type: ignore[list-item]
        max_output_tokens=2,
        temperature=0,
    )
    # Echoed as sent; the hosted web_search is not offered to the model.
    assert [t.type for t in response.tools] == ["function", "web_search"]
    assert response.usage is not None and response.usage.output_tokens == 2


def test_sqlite_store_survives_a_restart(server_factory: ServerFactory, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'responses.db'}"
    first_server = server_factory(private=True, response_store=url)  # stopped below
    client = first_server.client()
    one = client.responses.create(model="m", input="One.", max_output_tokens=3, temperature=0)
    two = client.responses.create(
        model="m", input="Two.", previous_response_id=one.id, max_output_tokens=3, temperature=0
    )
    assert first_server.stop() == 0
    second_server = server_factory(private=True, response_store=url)
    client = second_server.client()
    assert client.responses.retrieve(two.id).output_text == two.output_text
    three = client.responses.create(
        model="m", input="Three.", previous_response_id=two.id, max_output_tokens=3, temperature=0
    )
    assert three.usage is not None and two.usage is not None
    assert three.usage.input_tokens > two.usage.input_tokens


def test_store_failure_mid_stream_is_response_failed(server_factory: ServerFactory, tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    server = server_factory(private=True, response_store=f"sqlite:///{path}")  # its store is destroyed below
    client = server.client()
    client.responses.create(model="m", input="warm", max_output_tokens=2)
    # Destroy the database under the running server: the next save fails.
    for sidecar in path.parent.glob("broken.db*"):
        sidecar.write_bytes(b"this is not a database" * 64)
    events = events_of(server, {"model": "m", "input": "Hello", "max_output_tokens": 5})
    assert events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert isinstance(failed, dict) and failed["status"] == "failed" and failed["error"]["code"] == "server_error"  # type: ignore[index]
    assert not any(e["type"] in ("response.completed", "response.incomplete") for e in events)
    response_id = str(failed["id"])
    # The store cannot be read at all now, so the lookup is the store's failure, not an unknown id.
    lookup = loopback.get(f"{server.v1}/responses/{response_id}", timeout=10)
    assert lookup.status_code == 500, lookup.text
    assert lookup.json()["error"]["type"] == "server_error" and "database" not in lookup.text
    with contextlib.closing(sqlite3.connect(path)) as reader, pytest.raises(sqlite3.DatabaseError):
        reader.execute("select id from responses").fetchall()
    # The server itself keeps serving other APIs.
    assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2).usage


def test_input_items_page_by_limit_order_and_after(client: openai.OpenAI, server: Server) -> None:
    conversation = [{"role": "user", "content": f"Turn {i}."} for i in range(5)]
    created = client.responses.create(model="m", input=conversation, max_output_tokens=2)  # type: ignore[arg-type]
    newest_first = client.responses.input_items.list(created.id)
    ids = [item.id for item in newest_first.data]
    assert len(ids) == 5 and newest_first.first_id == ids[0] and newest_first.last_id == ids[-1]
    oldest_first = client.responses.input_items.list(created.id, order="asc", limit=2)
    assert [item.id for item in oldest_first.data] == ids[::-1][:2] and oldest_first.has_more is True
    rest = client.responses.input_items.list(created.id, order="asc", limit=2, after=oldest_first.last_id)
    assert [item.id for item in rest.data] == ids[::-1][2:4] and rest.has_more is True
    url = f"{server.v1}/responses/{created.id}/input_items"
    bad = (
        ("limit=-1", "limit"),
        ("limit=abc", "limit"),
        ("limit=101", "limit"),
        ("order=up", "order"),
        ("after=no", "after"),
    )
    for query, param in bad:
        refused = loopback.get(f"{url}?{query}", timeout=10)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, (query, refused.text)
