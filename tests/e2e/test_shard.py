"""One model over two ranks (ring backend on loopback): the same output as one process, and a lost rank is noticed.

Each model is served twice, by one process (`hypercorn app:app`) and by
two ranks with `--shard tensor`; every request goes to both, all of them
at once so that rows share the batch, and the texts must be equal
(sampled rows: equal up to a float near-tie, see SAMPLED): greedy and
seeded sampling, grammars, penalties, the three APIs, streamed and not,
an aborted stream beside them, a prompt-cache hit, and embeddings (every
rank runs their forward pass). A ring of three ranks
gives the same. The disk tier per rank is in test_shard_tiers.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests import loopback
from tests.conftest import Server, start_server
from tests.e2e.shard_harness import Sharded, start_sharded

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

USER = [{"role": "user", "content": "Tell me about the sea."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
MAX = 16

Ask = Callable[[Server], str]


def chat(stream: bool, **extra: object) -> Ask:
    def ask(server: Server) -> str:
        client = server.client()
        body = {"model": "m", "messages": USER, "max_tokens": MAX, **extra}
        if not stream:
            return client.chat.completions.create(**body).choices[0].message.content or ""  # type: ignore[call-overload, no-any-return]
        chunks = client.chat.completions.create(stream=True, **body)  # type: ignore[call-overload]
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)

    return ask


def messages(stream: bool) -> Ask:
    def ask(server: Server) -> str:
        client = server.anthropic_client()
        if not stream:
            reply = client.messages.create(model="m", max_tokens=MAX, messages=USER, extra_body={"temperature": 0})  # type: ignore[arg-type]
            return "".join(block.text for block in reply.content if block.type == "text")
        with client.messages.stream(model="m", max_tokens=MAX, messages=USER, extra_body={"temperature": 0}) as events:  # type: ignore[arg-type]
            return "".join(events.text_stream)

    return ask


def responses(stream: bool) -> Ask:
    def ask(server: Server) -> str:
        client = server.client()
        if not stream:
            return client.responses.create(
                model="m", input="Tell me about the sea.", max_output_tokens=MAX, temperature=0
            ).output_text
        events = client.responses.create(
            model="m", input="Tell me about the sea.", max_output_tokens=MAX, temperature=0, stream=True
        )
        return "".join(event.delta for event in events if event.type == "response.output_text.delta")

    return ask


CASES: dict[str, Ask] = {
    "chat-greedy": chat(False, temperature=0),
    "chat-greedy-stream": chat(True, temperature=0),
    "chat-seeded": chat(False, temperature=1.0, seed=11),
    "chat-seeded-stream": chat(True, temperature=0.8, top_p=0.9, seed=12),
    "chat-penalties": chat(False, temperature=0, presence_penalty=1.5, frequency_penalty=0.5),
    # A row's own stops (rank 0 sends them with the row; every rank must end it at the same step).
    "chat-own-stops": chat(False, temperature=0, extra_body={"ignore_eos": True, "stop_token_ids": [5, 17, 99]}),
    "chat-json-schema": chat(
        False,
        temperature=1.0,
        seed=3,
        max_tokens=80,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}},
    ),
    "messages": messages(False),
    "messages-stream": messages(True),
    "responses": responses(False),
    "responses-stream": responses(True),
}


def abort_one(server: Server) -> None:
    """A stream the client leaves after a few tokens, while the other rows run."""
    body = {"model": "m", "messages": USER, "max_tokens": 2000, "temperature": 0, "stream": True}
    with loopback.stream("POST", f"{server.v1}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for count, _ in enumerate(response.iter_lines()):
            if count > 6:
                break


# Rows that sample: tensor ranks add their partial sums over the ring and pipeline ranks run their layers apart, so
# a rank's logits differ from one process's in the last float bits (logprobs within 1e-5, measured on
# shaped:qwen3.5-0.8b-4l and shaped:qwen3-0.6b-2l). A greedy row's pick does not move for that; a sampled row's can,
# at a near-tie of its noisy scores, and from there the texts part. Before that the seeded stream must be the same:
# one that ignored the seed or a sampling field would part at the first tokens (8k-token vocabulary, near-flat
# random weights), never share a stretch this long.
SAMPLED = {"chat-seeded", "chat-seeded-stream", "chat-json-schema"}
SAMPLED_SHARED_PREFIX = 24


def assert_same_replies(expected: dict[str, str], got: dict[str, str]) -> None:
    assert all(expected.values()), expected
    assert got.keys() == expected.keys()
    for name, text in expected.items():
        if name not in SAMPLED:
            assert got[name] == text, name
            continue
        shared = next(
            (i for i, (a, b) in enumerate(zip(got[name], text, strict=False)) if a != b), min(len(got[name]), len(text))
        )
        assert shared >= min(len(text), SAMPLED_SHARED_PREFIX), (name, text, got[name])


def ask_all(server: Server) -> dict[str, str]:
    with ThreadPoolExecutor(len(CASES) + 1) as pool:
        aborted = pool.submit(abort_one, server)
        futures = {name: pool.submit(ask, server) for name, ask in CASES.items()}
        aborted.result()
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(
    scope="module",
    # A plain KVCache model (the demo architecture), a 4-bit Qwen3-0.6B-shaped one, and a pipeline of
    # Qwen3.5's recurrent and attention layers (its prompt cache keeps turn checkpoints).
    params=[("tiny", "tensor"), ("shaped:qwen3-0.6b-2l", "tensor"), ("shaped:qwen3.5-0.8b-4l", "pipeline")],
    ids=["tiny-tensor", "qwen3-tensor", "qwen3.5-pipeline"],
)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Sharded]]:
    """The same model served by one process and by two ranks."""
    model, mode = request.param
    log_dir = tmp_path_factory.mktemp("shard")
    single = start_server(log_dir, model=model)
    try:
        sharded = start_sharded(log_dir, model=model, mode=mode)
    except Exception:
        single.kill()
        raise
    yield single, sharded
    single.kill()
    sharded.kill()


def test_every_api_gives_one_process_output_with_rows_sharing_the_batch(pair: tuple[Server, Sharded]) -> None:
    single, sharded = pair
    expected, got = ask_all(single), ask_all(sharded.server)
    assert_same_replies(expected, got)
    json.loads(got["chat-json-schema"])
    # The aborted stream's row leaves once the server notices the client went: soon, not necessarily before the last
    # reply.
    deadline = time.monotonic() + 30
    while (
        stats := loopback.get(f"{sharded.server.base_url}/stats", timeout=10).json()
    ) and time.monotonic() < deadline:
        if stats["gateway"]["active"] == 0 and stats["sink_rows"] == 0:
            break
        time.sleep(0.1)
    assert stats["gateway"]["active"] == 0 and stats["sink_rows"] == 0


def test_a_prompt_cache_hit_gives_the_same_output(pair: tuple[Server, Sharded]) -> None:
    single, sharded = pair
    turn = [{"role": "user", "content": "A long first question about whales, dolphins and the deep sea, asked once."}]
    outputs = []
    for server in (single, sharded.server):
        client = server.client()
        replies = [
            client.chat.completions.create(model="m", messages=turn, max_tokens=MAX, temperature=0) for _ in range(2)
        ]  # type: ignore[arg-type]
        cached = replies[1].usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        assert cached and cached > 10
        outputs.append([reply.choices[0].message.content for reply in replies])
    assert outputs[0] == outputs[1]
    assert outputs[1][0] == outputs[1][1]


def test_every_rank_serves_the_weights_in_the_form_one_process_does(
    pair: tuple[Server, Sharded], request: pytest.FixtureRequest
) -> None:
    """On the CPU backend a quantized model is served dequantized to float32 (stages/models/weights.py): by one
    process, and by every rank of a sharded one, in rank 0's form (a follower plans nothing of its own)."""
    single, sharded = pair
    forms = [
        loopback.get(f"{server.base_url}/stats", timeout=10).json()["weights"] for server in (single, sharded.server)
    ]
    float32 = forms[0].startswith("float32")
    model, _ = request.node.callspec.params["pair"]
    assert float32 == model.startswith("shaped:")  # the shaped models are stored 4-bit; tiny is not quantized
    if float32:
        # The same form, and rank 0 names what it holds: its slice, never more than the whole model (a small shaped
        # model is mostly its embedding, which every rank holds whole).
        whole, mine = (float(re.search(r"\(([\d.]+) GiB", form).group(1)) for form in forms)  # type: ignore[union-attr]
        assert forms[1].startswith("float32") and "in this rank" in forms[1] and mine <= whole
    else:
        assert forms[0] == forms[1]
    follower_log = Path(str(sharded.server.log_path).replace("rank0", "rank1")).read_text()
    loaded = [json.loads(line) for line in follower_log.splitlines() if '"shard.loaded"' in line]
    assert [line["float32"] for line in loaded] == [float32]


def test_every_rank_reports_on_health(pair: tuple[Server, Sharded]) -> None:
    _, sharded = pair
    body = sharded.health().json()
    assert body["status"] == "ok"
    assert [rank["rank"] for rank in body["ranks"]] == [0, 1]
    assert all(rank["alive"] for rank in body["ranks"])


def test_embeddings_run_on_every_rank_and_generation_goes_on(pair: tuple[Server, Sharded]) -> None:
    single, sharded = pair
    texts = ["hello world", "a much longer sentence about the weather and the sea"]
    vectors = [
        server.client().embeddings.create(model="m", input=texts, encoding_format="float")
        for server in (single, sharded.server)
    ]
    one, two = ([item.embedding for item in answer.data] for answer in vectors)
    # The ranks' partial sums add in another order than one process's: equal to rounding.
    assert np.allclose(two, one, atol=1e-3)
    reply = sharded.server.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("length", "stop")


@pytest.fixture
def lone(tmp_path: Path) -> Iterator[Sharded]:
    sharded = start_sharded(tmp_path, model="tiny", shard_timeout="3")
    yield sharded
    sharded.kill()


def _stream_until_failed(server: Server, after: Callable[[], None], no_eos: dict[str, int]) -> tuple[list[str], float]:
    """Start a long stream, call `after` once tokens flow; the stream's lines and the seconds it took to end."""
    body = {"model": "m", "messages": USER, "max_tokens": 1800, "temperature": 0, "stream": True, "logit_bias": no_eos}
    lines: list[str] = []
    with loopback.stream("POST", f"{server.v1}/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if len(lines) == 6:
                after()
                started = time.monotonic()
    return lines, time.monotonic() - started


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_follower_fails_requests_and_turns_health_503(lone: Sharded, how: str, no_eos: dict[str, int]) -> None:
    follower = lone.followers[0]
    sent = signal.SIGKILL if how == "killed" else signal.SIGSTOP
    lines, took = _stream_until_failed(lone.server, lambda: os.kill(follower.pid, sent), no_eos)
    errors = [json.loads(line[6:]) for line in lines if line.startswith('data: {"error"')]
    assert errors and errors[0]["error"]["code"] == "engine_dead", lines[-3:]
    assert [line for line in lines if line][-1] == "data: [DONE]"
    assert took < 30
    health = lone.health()
    assert health.status_code == 503
    assert [rank["alive"] for rank in health.json()["ranks"]] == [True, False]
    refused = loopback.post(
        f"{lone.server.v1}/chat/completions", json={"model": "m", "messages": USER, "max_tokens": 4}, timeout=10
    )
    assert refused.status_code == 503
    if how == "hung":
        os.kill(follower.pid, signal.SIGCONT)


def test_stopping_rank_zero_stops_every_rank(lone: Sharded) -> None:
    client = lone.server.client()
    reply = client.chat.completions.create(model="m", messages=USER, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    assert lone.server.stop() == 0
    assert lone.followers[0].wait(timeout=30) == 0


def test_three_ranks_give_one_process_output(tmp_path: Path) -> None:
    """A ring of three over loopback (a model of six heads: each rank holds two)."""
    single = start_server(tmp_path, model="tiny-6h")
    try:
        sharded = start_sharded(tmp_path, model="tiny-6h", ranks=3)
    except Exception:
        single.kill()
        raise
    try:
        assert [rank["alive"] for rank in sharded.health().json()["ranks"]] == [True, True, True]
        expected, got = ask_all(single), ask_all(sharded.server)
        assert_same_replies(expected, got)
        texts = ["hello world", "the sea"]
        one, three = (
            [
                item.embedding
                for item in server.client().embeddings.create(model="m", input=texts, encoding_format="float").data
            ]
            for server in (single, sharded.server)
        )
        assert np.allclose(three, one, atol=1e-3)
    finally:
        single.kill()
        sharded.kill()
