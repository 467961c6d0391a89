"""Files and batches through the real `openai` and `anthropic` SDKs (docs/apis.md, "Files and batches")."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Server, ServerFactory

T = TypeVar("T")
_DEADLINE = 120.0


def _chat_line(custom_id: str, **body: object) -> dict[str, object]:
    request = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": request}


def _jsonl(lines: list[dict[str, object]]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(line) + "\n" for line in lines).encode())


def _until(read: Callable[[], T], done: Callable[[T], bool]) -> T:
    deadline = time.monotonic() + _DEADLINE
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _counts(batch: openai.types.Batch) -> openai.types.BatchRequestCounts:
    assert batch.request_counts is not None
    return batch.request_counts


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_to_completed_with_openai_s_output_lines(server: Server) -> None:
    """Upload, create, retrieve until completed; a line the chat decoder refuses fails alone into the error file."""
    client = server.client()
    lines = [_chat_line("a"), _chat_line("b"), _chat_line("bad", messages="not a list")]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status in ("validating", "in_progress") and _counts(batch).total == 3
    batch = _until(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
    assert batch.status == "completed", batch
    assert (_counts(batch).completed, _counts(batch).failed) == (2, 1)
    output = _lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == ["a", "b"]
    for line in output:
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"]
        assert response["body"]["object"] == "chat.completion"
    (error,) = _lines(client, batch.error_file_id)
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "messages"
    assert batch.id in [b.id for b in client.batches.list()]
    assert client.files.delete(uploaded.id).deleted
    # The server's counters since it started: this batch's lines at least (other tests share the server).
    metrics = _metrics(server)
    assert metrics["mlx_relay:batches_lines_completed_total"] >= 2
    assert metrics["mlx_relay:batches_lines_failed_total"] >= 1
    assert "mlx_relay:batches_in_progress" in metrics


def _metrics(server: Server) -> dict[str, float]:
    """`/metrics` as name -> value (each name here has one series: one model)."""
    text = httpx.get(f"{server.base_url}/metrics").text
    samples = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name.split("{", 1)[0]: float(value) for name, value in samples}


def test_a_malformed_jsonl_line_is_refused_at_upload(server: Server) -> None:
    client = server.client()
    data = io.BytesIO(json.dumps(_chat_line("ok")).encode() + b"\n{not json\n")
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("in.jsonl", data), purpose="batch")
    assert "Line 2" in refused.value.message


def test_cancel_ends_a_batch_cancelled(server: Server) -> None:
    client = server.client()
    lines = [_chat_line(f"r{i}", max_tokens=32) for i in range(40)]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = _until(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "cancelled")
    assert batch.status == "cancelled" and _counts(batch).completed < 40
    stats = httpx.get(f"{server.base_url}/stats").json()
    assert stats["batches"]["max_rows"] >= 1 and batch.id not in [b["id"] for b in stats["batches"]["running"]]


def test_anthropic_message_batches(server: Server) -> None:
    client = server.anthropic_client()
    params = {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    requests = [{"custom_id": "one", "params": params}, {"custom_id": "bad", "params": {**params, "max_tokens": -1}}]
    batch = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert batch.type == "message_batch" and batch.processing_status == "in_progress"
    batch = _until(lambda: client.messages.batches.retrieve(batch.id), lambda b: b.processing_status == "ended")
    assert (batch.request_counts.succeeded, batch.request_counts.errored) == (1, 1)
    results = {result.custom_id: result.result for result in client.messages.batches.results(batch.id)}
    assert results["one"].type == "succeeded" and results["one"].message.role == "assistant"
    assert results["bad"].type == "errored"
    assert batch.id in [b.id for b in client.messages.batches.list()]
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)
    long = [{"custom_id": f"r{i}", "params": {**params, "max_tokens": 32}} for i in range(40)]
    running = client.messages.batches.create(requests=long)  # type: ignore[arg-type]
    client.messages.batches.cancel(running.id)
    ended = _until(lambda: client.messages.batches.retrieve(running.id), lambda b: b.processing_status == "ended")
    assert ended.request_counts.canceled + ended.request_counts.succeeded + ended.request_counts.errored == 40
    kinds = {result.result.type for result in client.messages.batches.results(running.id)}
    assert kinds <= {"succeeded", "canceled", "errored"} and len(kinds) >= 1


@pytest.mark.slow
def test_past_its_window_a_batch_expires_and_another_key_s_batch_is_refused(server_factory: ServerFactory) -> None:
    """A window of 0 s: every batch is past it, its lines in the error file as `batch_expired`; keys own batches."""
    keyed = server_factory(api_key="k1,k2", batch_window="0")
    owner = openai.OpenAI(base_url=keyed.v1, api_key="k1", max_retries=0)
    other = openai.OpenAI(base_url=keyed.v1, api_key="k2", max_retries=0)
    keyed.clients += [owner, other]
    uploaded = owner.files.create(file=("in.jsonl", _jsonl([_chat_line("a"), _chat_line("b")])), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(uploaded.id)
    batch = owner.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch.id)
    assert batch.id not in [b.id for b in other.batches.list()]
    batch = _until(lambda: owner.batches.retrieve(batch.id), lambda b: b.status == "expired")
    assert batch.status == "expired" and batch.expired_at is not None
    errors = _lines(owner, batch.error_file_id)
    assert sorted(line["custom_id"] for line in errors) == ["a", "b"]
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}


# Run one at a time (batch_rows=1), enough that the kill, once two are done, lands with most still to run.
LINES = 16


@pytest.mark.slow
def test_a_batch_killed_mid_way_finishes_after_a_restart(server_factory: ServerFactory, tmp_path: object) -> None:
    """kill -9 while lines run; the restarted server keeps the lines done and runs the rest, each once."""
    settings = {"files_dir": str(tmp_path), "batch_rows": "1"}
    first = server_factory(private=True, **settings)
    client = first.client()
    # Lines long enough (a tenth of a second or more each, one at a time) that the poll sees the batch part-way
    # whatever the machine's load: a short batch could finish between two polls.
    lines = [_chat_line(f"r{i}", max_tokens=128, ignore_eos=True) for i in range(LINES)]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    running = _until(lambda: client.batches.retrieve(batch.id), lambda b: _counts(b).completed >= 2)
    first.kill()
    assert 2 <= _counts(running).completed < LINES and running.status == "in_progress"
    second = server_factory(private=True, **settings)
    client = second.client()
    batch = _until(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
    assert batch.status == "completed" and _counts(batch).completed == LINES
    output = _lines(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"r{i}" for i in range(LINES))
    assert "batch.resumed" in second.logs()
    second.kill()
