"""The model in a worker process of its own: a worker that dies or hangs fails only what it held, and comes back.

One server for the group (module scope), with a short restart back-off so
the restarts below stay quick; the heartbeat bound is 2 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable

import anthropic
import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.workers import front_pid, model_state, parent_pid, process_name, wait_ready

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hi"}]
# The heartbeat bound the hang test holds the server to (shorter than the default, so the test is quick).
HEARTBEAT_S = 2.0
# Streams in flight when the worker is killed: every API's terminal error must reach each within this.
ERROR_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def server(server_factory: ServerFactory) -> Server:
    return server_factory(worker_restart_backoff="0.05", worker_heartbeat_timeout=str(HEARTBEAT_S))


@pytest.fixture(scope="module")
def spawning(server_factory: ServerFactory) -> Server:
    """Workers spawned, each importing for about a second, as where the front cannot fork them."""
    return server_factory(worker_restart_backoff="0.05", worker_fork="off")


def answers(server: Server) -> None:
    client = server.client()
    completion = client.chat.completions.create(model="m", messages=HELLO, max_tokens=3, temperature=0)  # type: ignore[arg-type]
    assert completion.usage is not None and completion.usage.completion_tokens == 3


class Outcome:
    """How one stream ended: its API's terminal error (and when), or a normal end."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.error: str | None = None
        self.ended_at: float | None = None
        self.normal = False
        # A Responses stream's id, to look for in the store.
        self.response_id: str | None = None


def chat_stream(server: Server, no_eos: dict[str, int], outcome: Outcome) -> None:
    stream = server.client().chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1900,
        stream=True,
        logit_bias=no_eos,
    )
    try:
        for chunk in stream:
            # Its text or its reasoning: a random model may open a think section.
            if chunk.choices and chunk.choices[0].delta.model_dump(exclude_none=True).keys() - {"role"}:
                outcome.started.set()
        outcome.normal = True
    except openai.APIError as error:
        outcome.error = str(error)
    outcome.ended_at = time.monotonic()


def messages_stream(server: Server, outcome: Outcome) -> None:
    claude = server.anthropic_client()
    try:
        greedy = {"temperature": 0}  # through the body: this SDK's stream() takes no temperature argument
        with claude.messages.stream(model="m", max_tokens=1900, messages=HELLO, extra_body=greedy) as stream:  # type: ignore[arg-type]
            for event in stream:
                if event.type == "content_block_delta":
                    outcome.started.set()
        outcome.normal = True
    except anthropic.APIError as error:
        outcome.error = str(error)
    outcome.ended_at = time.monotonic()


def responses_stream(server: Server, outcome: Outcome) -> None:
    client = server.client()
    stream = client.responses.create(model="m", input="hi", max_output_tokens=1900, temperature=0, stream=True)
    for event in stream:
        if event.type == "response.created":
            outcome.response_id = event.response.id
        elif event.type.endswith(".delta"):
            outcome.started.set()
        elif event.type == "response.failed":
            outcome.error = str(event.response.error)
        elif event.type == "response.completed":
            outcome.normal = True
    outcome.ended_at = time.monotonic()


def test_health_names_the_worker_and_the_front_keeps_it_apart(server: Server) -> None:
    """/health names a worker process other than the front, forked by the front's zygote, and /v1/models shows
    the model ready."""
    pid = wait_ready(server)
    assert pid != server.process.pid and front_pid(pid) == server.process.pid
    assert process_name(pid) == "relay-worker" and process_name(parent_pid(pid)) == "relay-zygote"
    card = loopback.get(f"{server.v1}/models", timeout=10).json()["data"][0]
    assert card["state"] == "ready"


def test_kill_9_fails_every_stream_in_its_api_shape_then_the_model_answers_again(
    server: Server, no_eos: dict[str, int]
) -> None:
    """kill -9 of the worker with 8 streams in flight: each gets its API's terminal error within 2 s; none is stored."""
    pid = wait_ready(server)
    outcomes = [Outcome() for _ in range(8)]
    runs: list[Callable[[], None]] = [
        *(lambda o=o: chat_stream(server, no_eos, o) for o in outcomes[:3]),
        *(lambda o=o: messages_stream(server, o) for o in outcomes[3:6]),
        *(lambda o=o: responses_stream(server, o) for o in outcomes[6:]),
    ]
    threads = [threading.Thread(target=run, daemon=True) for run in runs]
    for thread in threads:
        thread.start()
    assert all(outcome.started.wait(60) for outcome in outcomes), "every stream streams before the kill"
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join(30)
    in_flight = [outcome for outcome in outcomes if not outcome.normal]
    # A random model may end a stream on its own just before the kill; at most a few.
    assert len(in_flight) >= 6, [(o.normal, o.error) for o in outcomes]
    for outcome in in_flight:
        assert outcome.error is not None and outcome.ended_at is not None
        assert "worker" in outcome.error, outcome.error
        assert outcome.ended_at - killed_at <= ERROR_WITHIN_S, outcome.ended_at - killed_at
    for outcome in in_flight:
        if outcome.response_id is not None:
            with pytest.raises(openai.NotFoundError):
                server.client().responses.retrieve(outcome.response_id)
    assert wait_ready(server, other_than=pid) != pid
    answers(server)
    stats = loopback.get(f"{server.base_url}/stats", timeout=10).json()
    assert stats["sink_rows"] == 0 and stats["admission"]["in_flight"] == 0


def test_a_hung_worker_is_killed_within_the_heartbeat_bound_and_restarted(server: Server) -> None:
    """SIGSTOP: the front notices within the heartbeat bound, kills the worker and starts another."""
    pid = wait_ready(server)
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        while model_state(server)["state"] == "ready":
            assert time.monotonic() - stopped_at < HEARTBEAT_S + 1.0, "the hang went unnoticed"
            time.sleep(0.05)
        noticed = time.monotonic() - stopped_at
    finally:
        # Never left stopped, whatever the test saw.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert noticed >= HEARTBEAT_S * 0.5
    assert wait_ready(server, other_than=pid) != pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    answers(server)


def spares_ready(server: Server) -> list[int]:
    """The spare workers the front has said are ready, in order (its log's `worker.spare_ready` lines)."""
    lines = [json.loads(line) for line in server.logs().splitlines() if '"worker.spare_ready"' in line]
    return [line["pid"] for line in lines]


def test_a_restart_takes_the_spare_worker_once_a_worker_has_restarted(spawning: Server) -> None:
    """After a restart, a front that spawns its workers keeps a spare worker (MLX_RELAY_WORKER_SPARE=auto), and the
    next restart is it, even when that restart comes while the spare is still importing."""
    server = spawning
    pid = wait_ready(server)
    assert model_state(server)["forked"] is False
    if model_state(server)["restarts"] == 0:
        os.kill(pid, signal.SIGKILL)
        pid = wait_ready(server, other_than=pid)
    deadline = time.monotonic() + 60
    while not (spares := [spare for spare in spares_ready(server) if spare != pid and alive(spare)]):
        assert time.monotonic() < deadline, "no spare worker became ready"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pid = wait_ready(server, other_than=pid)
    assert pid == spares[-1] and model_state(server)["spare"] is True
    answers(server)
    # Killed again at once: the next spare is still importing, and the restart waits for it, not for a new one.
    os.kill(pid, signal.SIGKILL)
    pid = wait_ready(server, other_than=pid)
    assert model_state(server)["spare"] is True and pid in spares_ready(server)
    assert '"worker.spare_hurried"' in server.logs()
    answers(server)


def test_a_forked_restart_keeps_no_spare(server: Server) -> None:
    """Where the zygote forks workers, `auto` keeps no spare: a restart is forked again, its imports done."""
    pid = wait_ready(server)
    zygote = parent_pid(pid)
    for _ in range(2):
        os.kill(pid, signal.SIGKILL)
        pid = wait_ready(server, other_than=pid)
        state = model_state(server)
        assert parent_pid(pid) == zygote and state["spare"] is False and state["forked"] is True
    answers(server)
    assert not spares_ready(server)
    assert "killed by SIGKILL" in server.logs()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
