"""Many streams in one batch, seeds that ignore their neighbours, and disconnects."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import sse_events, stats

HELLO = [{"role": "user", "content": "Tell me something."}]


def stream_text(server: Server, body: dict[str, object], barrier: threading.Barrier | None = None) -> tuple[str, str]:
    """The streamed text and finish reason of one chat request."""
    if barrier is not None:
        barrier.wait(timeout=30)
    pieces, finish = [], ""
    with loopback.stream(
        "POST", f"{server.v1}/chat/completions", json={**body, "stream": True}, timeout=120
    ) as response:
        assert response.status_code == 200, response.read()
        for event in sse_events(response):
            if isinstance(event, dict) and event["choices"]:
                choice = event["choices"][0]  # type: ignore[index]
                pieces.append(choice["delta"].get("content") or "")
                finish = choice["finish_reason"] or finish
    return "".join(pieces), finish


def test_sixteen_concurrent_streams_get_their_own_tokens(
    server: Server, tokenizer: Tokenizer, plain_tokens: list[int]
) -> None:
    # Each stream is pinned to its own token by a logit bias, so a token
    # delivered to the wrong stream, lost or repeated shows in its text.
    tokens = plain_tokens[:16]
    barrier = threading.Barrier(len(tokens))
    bodies = [
        {"messages": HELLO, "max_tokens": 40 + i, "temperature": 1.0, "logit_bias": {str(token): 100}}
        for i, token in enumerate(tokens)
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda body: stream_text(server, body, barrier), bodies))
    for i, (token, (text, finish)) in enumerate(zip(tokens, results, strict=True)):
        assert text == tokenizer.decode([token]) * (40 + i)
        assert finish == "length"


def test_seeded_output_does_not_depend_on_the_batch(server: Server, client: openai.OpenAI) -> None:
    seeded = [{"messages": HELLO, "max_tokens": 32, "temperature": 1.2, "seed": seed} for seed in range(6)]
    alone = [stream_text(server, body)[0] for body in seeded]
    assert len(set(alone)) > 1
    noise = [
        {"messages": [{"role": "user", "content": f"noise {i}"}], "max_tokens": 48, "temperature": 1.0}
        for i in range(6)
    ]
    bodies = seeded + noise
    barrier = threading.Barrier(len(bodies))
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda body: stream_text(server, body, barrier), bodies))
    assert [text for text, _ in together[: len(seeded)]] == alone


def test_prompts_arriving_beside_decoding_rows_share_their_pass_and_keep_their_text(
    server: Server, no_eos: dict[str, int]
) -> None:
    """A prompt that arrives while other rows decode is prefilled in the same forward pass as their step
    (stages/model_thread/mixed_steps.py); its reply is the one it gets alone, and /stats counts the mixed steps."""
    seeded = [{"messages": HELLO, "max_tokens": 24, "temperature": 1.2, "seed": seed} for seed in range(4)]
    alone = [stream_text(server, body)[0] for body in seeded]
    before = stats(server)["gateway"]["mixed_steps"]  # type: ignore[index]
    long = {"messages": HELLO, "max_tokens": 1500, "temperature": 1.0, "seed": 99, "logit_bias": no_eos}
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream_text, server, long)
        # One at a time, each while the long row decodes.
        beside = [stream_text(server, body)[0] for body in seeded]
        running.result()
    assert beside == alone
    assert stats(server)["gateway"]["mixed_steps"] > before  # type: ignore[index]


def test_disconnect_mid_stream_frees_the_row(server: Server, client: openai.OpenAI, no_eos: dict[str, int]) -> None:
    def gateway() -> dict[str, int]:
        value = stats(server)["gateway"]
        assert isinstance(value, dict)
        return value

    before = gateway()
    body = {"messages": HELLO, "max_tokens": 1900, "stream": True, "logit_bias": no_eos}
    with loopback.stream("POST", f"{server.v1}/chat/completions", json=body, timeout=60) as response:
        seen = 0
        for event in sse_events(response):
            seen += isinstance(event, dict)
            if seen == 5:
                break
    deadline = time.monotonic() + 10
    while gateway()["active"] != 0:
        assert time.monotonic() < deadline, "the aborted row stayed in the batch"
        time.sleep(0.05)
    generated = gateway()["generated_tokens"] - before["generated_tokens"]
    assert generated < 1900
    assert "gateway.abort" in server.logs()
    completion = client.chat.completions.create(model="m", messages=HELLO, max_tokens=5, temperature=0)  # type: ignore[arg-type]
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    after = stats(server)
    assert after["admission"]["in_flight"] == 0  # type: ignore[index]


@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_a_stalled_reader_neither_stalls_others_nor_grows_the_crossing(
    server_factory: ServerFactory, no_eos: dict[str, int], in_process: bool
) -> None:
    """A client that stops reading: its events wait in its reply, the other rows go on, and the
    steps held between the model thread and the loop never pass the bound (stages/model_thread/handoff.py).

    In a model worker the model thread writes each step's frame to the socket itself (workers/frames_out.py),
    and only a step's other work (prompt-cache spills, finished jobs) crosses the handoff, at most
    `steps_ahead` of it; a front that stops reading blocks the frame's write instead. The shared server's
    earlier spills may have filled that once, so the worker's bound is asserted, not a zero.
    """
    server = server_factory(in_process="1") if in_process else server_factory()
    client = server.client()
    body = json.dumps({"model": "m", "messages": HELLO, "max_tokens": 1500, "stream": True, "logit_bias": no_eos})
    host, port = server.base_url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.socket() as stalled:
        # A small window: the server's writes to this reader block soon.
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        stalled.sendall(head.encode() + body.encode())
        other = client.chat.completions.create(
            model="m", messages=HELLO, max_tokens=64, temperature=0, logit_bias=no_eos
        )  # type: ignore[arg-type]
        assert other.usage is not None and other.usage.completion_tokens == 64
        gateway = stats(server)["gateway"]
        assert isinstance(gateway, dict)
        handoff = gateway["handoff"]
        assert handoff["steps_undelivered_max"] <= handoff["steps_ahead"]
        if in_process:
            assert handoff["steps_undelivered_max"] > 0
    deadline = time.monotonic() + 30
    while (gateway := stats(server)["gateway"]) and gateway["active"] != 0:  # type: ignore[index]
        assert time.monotonic() < deadline, "the stalled reader's row stayed in the batch after it left"
        time.sleep(0.05)
