"""Exclusive work yields the model: a long embeddings job on an idle server, a chat that arrives during it, and
the per-request bound on such work (real server, the tiny model)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

PHRASE = "the weather over the sea was calm and grey {} {} "
# About 300 tokens an input on the tiny model's vocabulary, as in the probe.
LONG_INPUT = 15
BOUND = 100_000


@pytest.fixture(scope="module")
def server(server_factory: ServerFactory) -> Server:
    return server_factory(step_budget_ms="50", exclusive_max_tokens=str(BOUND))


def _events(server: Server, event: str, trace_id: str) -> list[dict[str, object]]:
    found = []
    for line in server.logs().splitlines():
        if line.startswith("{") and event in line and trace_id in line:
            entry = json.loads(line)
            if entry.get("event") == event and entry.get("trace_id") == trace_id:
                found.append(entry)
    return found


@pytest.mark.slow
def test_a_chat_arriving_during_a_long_embeddings_job_on_an_idle_server_goes_first(server: Server) -> None:
    """The job started with no stream running; the chat waits for a chunk, not the job: it finishes first, and
    its own queue wait is a small part of the job's run."""
    inputs = ["".join(PHRASE.format(i, j) for j in range(LONG_INPUT)) for i in range(256)]
    finished: dict[str, float] = {}
    statuses: list[int] = []

    def embed() -> None:
        headers = {"x-request-id": "big-job"}
        response = loopback.post(f"{server.v1}/embeddings", json={"input": inputs}, headers=headers, timeout=600)
        finished["embed"] = time.monotonic()
        statuses.append(response.status_code)

    job = threading.Thread(target=embed)
    job.start()
    try:
        # The job is running once the model thread has run a chunk of it.
        deadline = time.monotonic() + 120
        while (
            loopback.get(f"{server.base_url}/stats").json()["exclusive"]["chunks"] == 0 and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        chat = loopback.post(
            f"{server.v1}/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            headers={"x-request-id": "chat-during-job"},
            timeout=600,
        )
        finished["chat"] = time.monotonic()
    finally:
        job.join()
    assert chat.status_code == 200 and statuses == [200]
    assert finished["chat"] < finished["embed"], "the chat waited for the whole embeddings job"
    (queued,) = _events(server, "request.queue", "chat-during-job")
    (ran,) = _events(server, "request.embed", "big-job")
    assert float(queued["duration"]) < float(ran["duration_s"]) / 4, (queued, ran)  # type: ignore[arg-type]


@pytest.mark.parametrize("as_ids", [True, False], ids=["token-ids", "texts"])
def test_a_request_past_the_exclusive_token_bound_is_a_400_naming_it(server: Server, as_ids: bool) -> None:
    """Token ids are counted before anything runs; texts are tokenized and counted before the work is queued."""
    chunks_before = loopback.get(f"{server.base_url}/stats").json()["exclusive"]["chunks"]
    per_input = 1900
    count = BOUND // per_input + 1
    inputs: list[object]
    if as_ids:
        inputs = [[5] * per_input for _ in range(count)]
    else:
        inputs = ["".join(PHRASE.format(i, j) for j in range(per_input // 22)) for i in range(count * 2)]
    response = loopback.post(f"{server.v1}/embeddings", json={"input": inputs}, timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "max_tokens_per_request"
    assert error["param"] == "input" and f"max {BOUND} tokens per request" in error["message"]
    assert "MLX_RELAY_EXCLUSIVE_MAX_TOKENS" in error["message"]
    assert loopback.get(f"{server.base_url}/stats").json()["exclusive"]["chunks"] == chunks_before
    assert loopback.post(f"{server.v1}/embeddings", json={"input": inputs[:2]}, timeout=120).status_code == 200
