"""Background Responses through the `openai` SDK: create, poll, cancel, re-attach, ownership, restart.

docs/apis.md, "Background responses". The session server for what needs default settings; private
servers (slow) for API keys and for a kill -9 and restart over a SQLite store.
"""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.conftest import Server, ServerFactory

# Long enough that a cancel lands mid-run on the tiny model; greedy, because a sampled run on the
# random-weight model can draw its end-of-sequence token early and finish before the cancel.
LONG = 1500
DEADLINE = 60.0


def _until(client: openai.OpenAI, response_id: str, *statuses: str) -> openai.types.responses.Response:
    """Polls `retrieve` until the response reaches one of `statuses` (bounded)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        response = client.responses.retrieve(response_id)
        if response.status in statuses or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_background_answers_queued_then_completes(client: openai.OpenAI) -> None:
    created = client.responses.create(model="m", input="Hello", background=True, max_output_tokens=8)
    assert created.status == "queued" and created.background is True
    done = _until(client, created.id, "completed", "incomplete", "failed")
    assert done.status in ("completed", "incomplete"), done.error
    assert done.usage is not None and 0 < done.usage.output_tokens <= 8
    assert done.output_text == "".join(
        part.text
        for item in done.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    )


def test_cancel_mid_run_keeps_the_partial_output(client: openai.OpenAI) -> None:
    created = client.responses.create(model="m", input="Go on", background=True, max_output_tokens=LONG, temperature=0)
    running = _until(client, created.id, "in_progress", "completed", "incomplete")
    assert running.status == "in_progress"
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    # What was generated before the stop is kept, and stays as stored.
    assert cancelled.output and cancelled.output_text
    again = client.responses.retrieve(created.id)
    assert again.status == "cancelled" and again.output_text == cancelled.output_text
    # Cancelling what has finished answers it unchanged.
    assert client.responses.cancel(created.id).output_text == cancelled.output_text


def test_reattach_gives_exactly_the_events_after_n(client: openai.OpenAI) -> None:
    stream = client.responses.create(model="m", input="Count", background=True, stream=True, max_output_tokens=24)
    seen = []
    for event in stream:
        seen.append(event)
        if len(seen) == 5:
            break
    stream.close()  # the client drops; the run goes on
    response_id = seen[0].response.id  # type: ignore[union-attr]
    assert [event.type for event in seen[:2]] == ["response.created", "response.queued"]
    after = seen[-1].sequence_number
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=after))
    numbers = [event.sequence_number for event in seen + rest]
    assert numbers == list(range(len(numbers)))
    assert rest[-1].type in ("response.completed", "response.incomplete")
    assert [
        event.sequence_number for event in client.responses.retrieve(response_id, stream=True, starting_after=-1)
    ] == numbers
    final = client.responses.retrieve(response_id)
    texts = "".join(event.delta for event in seen + rest if event.type == "response.output_text.delta")
    assert final.output_text == texts


def test_background_needs_store(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="m", input="x", background=True, store=False)
    assert refused.value.body["param"] == "background"  # type: ignore[index]


def test_a_synchronous_response_cannot_be_cancelled(client: openai.OpenAI) -> None:
    done = client.responses.create(model="m", input="x", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        client.responses.cancel(done.id)


def test_delete_a_background_response(client: openai.OpenAI) -> None:
    created = client.responses.create(model="m", input="Go on", background=True, max_output_tokens=LONG, temperature=0)
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    time.sleep(0.3)  # had the stopped run stored itself again, it would be back by now
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


@pytest.mark.slow
def test_another_key_cannot_read_or_cancel(server_factory: ServerFactory) -> None:
    server = server_factory(api_key="key-one,key-two")
    one, two = (server.client().with_options(api_key=key) for key in ("key-one", "key-two"))
    created = one.responses.create(model="m", input="Go on", background=True, max_output_tokens=LONG, temperature=0)
    with pytest.raises(openai.NotFoundError):
        two.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        two.responses.cancel(created.id)
    assert one.responses.cancel(created.id).status == "cancelled"


@pytest.mark.slow
def test_a_restart_marks_running_work_failed(server_factory: ServerFactory, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'responses.db'}"
    first: Server = server_factory(private=True, response_store=url)  # killed below
    client = first.client()
    created = client.responses.create(model="m", input="Go on", background=True, max_output_tokens=LONG, temperature=0)
    assert _until(client, created.id, "in_progress").status == "in_progress"
    first.kill()
    second = server_factory(private=True, response_store=url)
    after = second.client().responses.retrieve(created.id)
    assert after.status == "failed"
    assert after.error is not None and "not resumed" in after.error.message
