"""One model's worker killed in a two-model fleet: the other model's streams go on as if nothing happened.

A private `tiny,demo` server with the prompt cache off, so a stream run twice is computed the same way twice
(no cached prefix the second time). The surviving model's stream runs alone in its worker's batch: its tokens never
depend on when another row joined it. The reference is the same requests on the same server before the kill,
so no BLAS's exact tokens are assumed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import attrs
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests import loopback
from tests.conftest import Server, ServerFactory

pytestmark = pytest.mark.slow

VICTIM, SURVIVOR = "tiny", "demo"
# `demo` streams 20-75 tokens a second on a loaded 2-core machine, faster on a quiet one: 120 of them once ended
# before the victims' first tokens let the kill go (a clean-clone run, 2026-12-06); 300 outlast it by seconds.
SURVIVOR_TOKENS = 300
# Survivors started, one after another, while waiting for a young victim row to kill.
SURVIVOR_TRIES = 4
# `tiny` is ten times faster, and admits 1,792 tokens a request beside `demo`: its streams must still be running
# when they are cut.
VICTIM_TOKENS = 1700
# A victim row holding this much KV or less has 600+ tokens left, 0.3 s or more of `tiny`'s fastest decoding: the
# kill lands while it runs.
EARLY_ROW_TOKENS = 1024
# Every stream runs to its length, never cut short by an EOS (wire/openai_extensions.py).
NO_EOS = {"ignore_eos": True}


@attrs.define
class Stream:
    """One streamed chat completion as its client saw it."""

    model: str
    max_tokens: int
    started: threading.Event = attrs.field(factory=threading.Event)
    text: str = ""
    finish: str | None = None
    error: openai.APIError | None = None
    # When each content chunk arrived (time.monotonic()).
    arrivals: list[float] = attrs.field(factory=list)

    def run(self, server: Server) -> None:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        try:
            chunks = server.client().chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=self.max_tokens,
                stream=True,
                temperature=0,
                extra_body=NO_EOS,
            )
            for chunk in chunks:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                if choice.delta.content:
                    self.text += choice.delta.content
                    self.arrivals.append(time.monotonic())
                    self.started.set()
                self.finish = choice.finish_reason or self.finish
        except openai.APIError as error:
            self.error = error
        finally:
            self.started.set()


def run_all(server: Server, streams: list[Stream]) -> None:
    threads = [threading.Thread(target=stream.run, args=(server,), daemon=True) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive(), "a stream did not end"


def health_of(server: Server, model: str) -> dict[str, object]:
    report = loopback.get(f"{server.base_url}/health", timeout=10).json()["models"][f"mlx-relay/{model}"]
    assert isinstance(report, dict)
    return report


@attrs.define
class Completion:
    """One chat completion asked for whole: the client waits while the server generates all of it."""

    finish: str | None = None
    error: openai.APIError | None = None

    def run(self, server: Server) -> None:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        try:
            reply = server.client().chat.completions.create(
                model=VICTIM, messages=messages, max_tokens=VICTIM_TOKENS, temperature=0, extra_body=NO_EOS
            )
            self.finish = reply.choices[0].finish_reason
        except openai.APIError as error:
            self.error = error


Run = TypeVar("Run", Stream, Completion)


def early_row_in(server: Server, model: str) -> bool:
    """Whether the model's worker holds a row with hundreds of tokens still to write: the worker's own count, asked
    fresh, of the KV its rows hold (as the batch pads them, so a row's own count or more). A client's view cannot
    tell: a request may not have reached the worker yet, or may be written whole and still being read."""
    load = loopback.get(f"{server.base_url}/v1/loads?model={model}", timeout=10).json()["loads"][0]
    rows, held = load["num_running_reqs"], load["num_used_tokens"]
    return bool(rows) and held <= rows * EARLY_ROW_TOKENS


def until_killed(server: Server, killed: threading.Event, make: Callable[[], Run], runs: list[Run]) -> None:
    """`tiny`'s requests one after another until the kill: `tiny` writes 1,700 tokens in under a second, so a lone
    request once ended whole before the kill went; back to back, the worker holds a young row every second or so."""
    while not killed.is_set():
        run = make()
        runs.append(run)
        run.run(server)


def start_survivor(server: Server) -> tuple[Stream, threading.Thread]:
    """`demo`'s stream, started and seen writing, on a thread of its own."""
    survivor = Stream(SURVIVOR, SURVIVOR_TOKENS)
    surviving = threading.Thread(target=run_all, args=(server, [survivor]), daemon=True)
    surviving.start()
    assert survivor.started.wait(60) and survivor.arrivals, survivor.error
    return survivor, surviving


def test_kill_9_of_one_models_worker_leaves_the_other_models_streams_unchanged(server_factory: ServerFactory) -> None:
    """kill -9 of `tiny`'s worker while `tiny` and `demo` stream: `demo`'s stream finishes with the text it had
    before the kill, `tiny`'s streams fail with 503 `worker_lost`, and `tiny`'s next request is served by a new
    worker."""
    # Prompt lookup off: `demo`'s greedy loops are what it copies best, and a survivor sped up by it could end before
    # the kill; the streams' lengths above are sized for plain decoding.
    server = server_factory(
        private=True,
        model=f"{VICTIM},{SURVIVOR}",
        worker_restart_backoff="0.05",
        prompt_cache_bytes="0",
        prompt_lookup="0",
    )
    # The reference, both models loaded and streaming: the survivor's stream runs to its end.
    before = Stream(SURVIVOR, SURVIVOR_TOKENS)
    run_all(server, [before, Stream(VICTIM, 8)])
    assert before.error is None and before.finish == "length" and before.text, before
    victim_pid, survivor_pid = health_of(server, VICTIM)["pid"], health_of(server, SURVIVOR)["pid"]
    assert isinstance(victim_pid, int) and victim_pid != survivor_pid

    survivor, surviving = start_survivor(server)
    killed = threading.Event()
    streams: list[Stream] = []
    completions: list[Completion] = []
    victims = [
        threading.Thread(target=until_killed, args=(server, killed, kind, runs), daemon=True)
        for kind, runs in [(partial(Stream, VICTIM, VICTIM_TOKENS), streams), (Completion, completions)]
    ]
    for thread in victims:
        thread.start()
    # On a loaded machine a survivor has run to its end before a young victim row was seen (a clean-clone run,
    # 2026-12-07): a fresh one, the same request, takes its place, so the kill lands inside a survivor's stream.
    for _ in range(SURVIVOR_TRIES):
        while surviving.is_alive() and not early_row_in(server, VICTIM):
            time.sleep(0.01)
            assert all(t.is_alive() for t in victims), (streams, completions)
        if surviving.is_alive():
            break
        assert survivor.error is None and survivor.text == before.text, survivor
        survivor, surviving = start_survivor(server)
    else:
        pytest.fail(f"no young {VICTIM} row was seen while {SURVIVOR_TRIES} {SURVIVOR} streams ran")
    killed_at = time.monotonic()
    killed.set()
    os.kill(victim_pid, signal.SIGKILL)
    for thread in [*victims, surviving]:
        thread.join(150)
        assert not thread.is_alive(), "the streams did not end"

    assert survivor.error is None, survivor.error
    assert [t for t in survivor.arrivals if t > killed_at], "the survivor's stream was still running at the kill"
    assert survivor.text == before.text and survivor.finish == "length"
    # Each of `tiny`'s requests ended whole, before the kill, or failed with 503 `worker_lost`: none was cut short in
    # silence; the row the worker held at the kill failed.
    runs: list[Stream | Completion] = [*streams, *completions]
    assert all(r.finish == "length" if r.error is None else r.error.code == "worker_lost" for r in runs), runs
    assert any(r.error is not None for r in runs), runs
    assert health_of(server, SURVIVOR)["pid"] == survivor_pid and health_of(server, SURVIVOR)["restarts"] == 0

    after = Stream(VICTIM, 8)
    run_all(server, [after])
    assert after.error is None and after.finish == "length" and after.text
    report = health_of(server, VICTIM)
    assert report["state"] == "ready" and report["pid"] not in (victim_pid, None) and report["restarts"] == 1, report
