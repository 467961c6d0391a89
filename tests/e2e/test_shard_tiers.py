"""Two ranks over loopback: the disk tier per rank, and embeddings and scores on a sharded model.

The reference is one process serving the same model with no prompt cache,
so every answer it gives is a full prefill. The sharded server's prompt
cache holds one conversation per rank, and its disk tier (one folder per
rank) takes what is evicted: a restored conversation must answer as the
prefill did, and a follower that cannot read its copy must not split the
group from rank 0 (every rank prefills instead).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server, start_server
from tests.e2e.shard_harness import Sharded, start_sharded

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

Messages = list[dict[str, str]]
# One of these conversations is ~330 tokens: ~85 kB of the tiny model's KV on each of two tensor ranks, and
# ~92 kB of the host objects that key it (stages/cache/tier.py), which the cap counts too: room for one.
RANK_CACHE_BYTES = 265_000
TEXTS = ["hello world", "a much longer sentence about the weather and the sea", "x", "tokens and more tokens"]


def system(name: str) -> str:
    return f"{name} conversation. " + "You are a careful assistant. " * 20


def opening(name: str) -> Messages:
    return [{"role": "system", "content": system(name)}, {"role": "user", "content": f"Hello from {name}."}]


def chat(server: Server, messages: Messages) -> Any:
    return server.client().chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0)  # type: ignore[arg-type]


def reply(messages: Messages, completion: Any, question: str) -> Messages:
    return [
        *messages,
        {"role": "assistant", "content": completion.choices[0].message.content},
        {"role": "user", "content": question},
    ]


def cached(completion: Any) -> int:
    return int(completion.usage.prompt_tokens_details.cached_tokens)


def disk_stats(server: Server) -> dict[str, Any]:
    value = loopback.get(f"{server.base_url}/stats", timeout=10).json()["prompt_cache"]["disk"]
    assert isinstance(value, dict)
    return value


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv")


@pytest.fixture(scope="module")
def pair(
    tiny_model: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Sharded]]:
    log_dir = tmp_path_factory.mktemp("shard-tiers")
    single = start_server(log_dir, model="tiny", prompt_cache_bytes="0")
    try:
        sharded = start_sharded(
            log_dir, model="tiny", prompt_cache_bytes=str(RANK_CACHE_BYTES), cache_dir=str(cache_dir)
        )
    except Exception:
        single.kill()
        raise
    yield single, sharded
    single.kill()
    sharded.kill()


def files(cache_dir: Path, tokenizer: Tokenizer, name: str, rank: int) -> list[Path]:
    """Rank `rank`'s disk files holding conversation `name`; written in the background, so wait (bounded)."""
    deadline = time.monotonic() + 20
    while True:
        found = [
            path
            for path in cache_dir.glob(f"*/tensor-rank{rank}-of-2/*.safetensors")
            if system(name) in _text(path, tokenizer)
        ]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _text(path: Path, tokenizer: Tokenizer) -> str:
    try:
        tokens = mx.load(str(path))["tokens"].tolist()
    except (OSError, RuntimeError, ValueError):
        return ""
    return str(tokenizer.decode(tokens, skip_special_tokens=False))


def test_an_evicted_conversation_comes_back_from_every_ranks_disk(
    pair: tuple[Server, Sharded], cache_dir: Path, tokenizer: Tokenizer
) -> None:
    single, sharded = pair
    x, y = opening("disk x"), opening("disk y")
    x1 = chat(sharded.server, x)
    chat(sharded.server, y)  # evicts x: rank 0 spills its slice, and the followers theirs when they replay that step
    assert files(cache_dir, tokenizer, "disk x", 0)
    turn2 = reply(x, x1, "Remember me?")
    restored = chat(sharded.server, turn2)
    assert files(cache_dir, tokenizer, "disk x", 1)
    assert disk_stats(sharded.server)["restores"] == 1
    assert cached(restored) >= x1.usage.prompt_tokens - 2
    assert x1.choices[0].message.content == chat(single, x).choices[0].message.content
    assert restored.choices[0].message.content == chat(single, turn2).choices[0].message.content


def test_a_follower_that_cannot_read_its_copy_makes_every_rank_prefill(
    pair: tuple[Server, Sharded], cache_dir: Path, tokenizer: Tokenizer
) -> None:
    single, sharded = pair
    z, w = opening("disk z"), opening("disk w")
    z1 = chat(sharded.server, z)
    chat(sharded.server, w)
    # A short request carries the step that evicted z to the follower, which then writes its copy.
    chat(sharded.server, [{"role": "user", "content": "hi"}])
    (mine,) = files(cache_dir, tokenizer, "disk z", 0)
    (theirs,) = files(cache_dir, tokenizer, "disk z", 1)
    data = bytearray(theirs.read_bytes())
    data[-5] ^= 0xFF
    theirs.write_bytes(bytes(data))
    before = disk_stats(sharded.server)["restores"]
    turn2 = reply(z, z1, "Remember me?")
    answer = chat(sharded.server, turn2)
    assert cached(answer) < 10 and disk_stats(sharded.server)["restores"] == before
    # The group agreed to drop the entry: rank 0 deleted its good copy too.
    assert not theirs.exists() and not mine.exists()
    assert answer.choices[0].message.content == chat(single, turn2).choices[0].message.content
    # Still one group: the next request is served.
    assert (
        chat(sharded.server, opening("after")).choices[0].message.content
        == chat(single, opening("after")).choices[0].message.content
    )


def test_embeddings_and_scores_run_on_every_rank_and_match_one_process(pair: tuple[Server, Sharded]) -> None:
    single, sharded = pair
    answers = []
    for server in (single, sharded.server):
        vectors = server.client().embeddings.create(model="m", input=TEXTS, encoding_format="float")
        scores = loopback.post(f"{server.v1}/score", json={"text_1": "ocean", "text_2": TEXTS}, timeout=60).json()
        ranked = loopback.post(f"{server.v1}/rerank", json={"query": "ocean", "documents": TEXTS}, timeout=60).json()
        answers.append(
            (np.array([item.embedding for item in vectors.data]), [item["score"] for item in scores["data"]], ranked)
        )
    (one, one_scores, one_ranked), (two, two_scores, two_ranked) = answers
    # The sharded sums add in another order: equal to rounding, not to the bit.
    np.testing.assert_allclose(two, one, atol=1e-4)
    assert two_scores == pytest.approx(one_scores, abs=1e-4)
    assert _by_index(two_ranked) == pytest.approx(_by_index(one_ranked), abs=1e-4)
    reply = sharded.server.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("length", "stop")


def _by_index(ranked: dict[str, Any]) -> list[float]:
    return [score for _, score in sorted((item["index"], item["relevance_score"]) for item in ranked["results"])]
