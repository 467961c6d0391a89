"""The prompt cache, session affinity and memory admission through real servers and the openai SDK.

Each server here gets its own settings: the cache on (the default), off,
small enough to evict, small with a disk tier, and a memory budget tight
enough to refuse. Conversations are greedy (temperature 0) so that
outputs can be compared across servers token for token.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import openai
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats, stream_chunks

Messages = list[dict[str, str]]
# One entry of these conversations is ~330 tokens: ~170 kB of the tiny model's KV, and ~90 kB of the host
# objects that key it (stages/cache/tier.py), which the cap counts too.
ENTRY_BYTES = 260_000


def system(name: str) -> str:
    # Distinct from the first words: conversations share only the template's opening tokens.
    return f"{name} conversation. " + "You are a careful assistant. " * 20


def opening(name: str) -> Messages:
    return [{"role": "system", "content": system(name)}, {"role": "user", "content": f"Hello from {name}."}]


def chat(server: Server, messages: Messages, **extra: Any) -> Any:
    options = {"max_tokens": 12, "temperature": 0, **extra}
    return server.client().chat.completions.create(model="m", messages=messages, **options)  # type: ignore[arg-type]


def reply(messages: Messages, completion: Any, question: str) -> Messages:
    """The conversation one turn on: the reply as the client saw it, and a new question."""
    content = completion.choices[0].message.content
    return [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": question}]


def cached(completion: Any) -> int:
    details = completion.usage.prompt_tokens_details
    assert details is not None
    return int(details.cached_tokens)


def cache_stats(server: Server) -> dict[str, Any]:
    value = stats(server)["prompt_cache"]
    assert isinstance(value, dict)
    return value


@pytest.fixture(scope="module")
def cached_server(server_factory: ServerFactory) -> Server:
    return server_factory()


@pytest.fixture(scope="module")
def uncached_server(server_factory: ServerFactory) -> Server:
    return server_factory(prompt_cache_bytes="0")


@pytest.fixture(scope="module")
def small_server(server_factory: ServerFactory) -> Server:
    """Room for two conversations' entries, no disk."""
    return server_factory(prompt_cache_bytes=str(2 * ENTRY_BYTES + ENTRY_BYTES // 2))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv")


@pytest.fixture(scope="module")
def disk_server(server_factory: ServerFactory, cache_dir: Path) -> Server:
    """Room for one entry in memory; evictions spill to `cache_dir`."""
    return server_factory(prompt_cache_bytes=str(ENTRY_BYTES + ENTRY_BYTES // 2), cache_dir=str(cache_dir))


def test_the_second_turn_of_a_growing_conversation_reuses_the_first(cached_server: Server) -> None:
    messages = opening("growing")
    first = chat(cached_server, messages)
    assert cached(first) < 10  # only the template's opening tokens can be shared with other tests' entries
    second = chat(cached_server, reply(messages, first, "And then?"))
    # Everything up to the first turn's answer: the answer itself is re-tokenized from its text.
    assert first.usage.prompt_tokens - 2 <= cached(second) < second.usage.prompt_tokens
    third = chat(cached_server, reply(reply(messages, first, "And then?"), second, "Finally?"))
    assert cached(third) >= second.usage.prompt_tokens - 2


def test_cached_tokens_in_the_stream_usage_chunk_and_completions(cached_server: Server) -> None:
    body: dict[str, object] = {
        "messages": opening("streamed"),
        "max_tokens": 4,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    stream_chunks(cached_server, "/chat/completions", body)
    usage = stream_chunks(cached_server, "/chat/completions", body)[-2]["usage"]  # type: ignore[index]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1  # type: ignore[index]
    prompt = system("text") + " Once upon a time"
    client = cached_server.client()
    client.completions.create(model="m", prompt=prompt, max_tokens=4, temperature=0)
    again = client.completions.create(model="m", prompt=prompt + " there was", max_tokens=4, temperature=0)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 200


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 11}], ids=["greedy", "seeded"])
def test_output_with_a_hit_equals_output_without_cache(
    cached_server: Server, uncached_server: Server, sampling: dict[str, Any]
) -> None:
    """Turn after turn, the server that reuses KV answers exactly what the one without a cache answers."""
    messages = opening(f"identical {sampling['temperature']}")
    for turn in range(3):
        hit, cold = (chat(server, messages, **sampling) for server in (cached_server, uncached_server))
        assert hit.choices[0].message.content == cold.choices[0].message.content
        assert hit.usage.completion_tokens == cold.usage.completion_tokens == 12
        assert cached(cold) == 0 and (turn == 0 or cached(hit) > 200)
        messages = reply(messages, cold, f"Question {turn}?")
    assert stats(uncached_server)["prompt_cache"] is None


def test_the_byte_cap_evicts_the_least_recently_used(small_server: Server) -> None:
    turns = {name: opening(f"cap {name}") for name in "abc"}
    firsts = {name: chat(small_server, messages) for name, messages in turns.items()}
    state = cache_stats(small_server)
    assert state["bytes"] <= state["max_bytes"] and state["evictions"] >= 1 and state["entries"] == 2
    # a went first and was evicted; c is still there.
    assert cached(chat(small_server, reply(turns["a"], firsts["a"], "More?"))) < 10
    assert cached(chat(small_server, reply(turns["c"], firsts["c"], "More?"))) > 200


_SESSION_HEADERS = {"header": "x-session-affinity", "smg-header": "x-smg-routing-key"}


@pytest.mark.parametrize("how", ["prompt_cache_key", "session_id", "header", "smg-header"])
def test_a_session_keeps_its_conversation_warm(small_server: Server, how: str) -> None:
    """Three other conversations pass through a cache that holds two; the session's entry stays.
    smg forwards only its own routing header, so that one names a session too."""
    key = f"session-{how}"
    extra: dict[str, Any] = (
        {"extra_headers": {_SESSION_HEADERS[how]: key}} if how in _SESSION_HEADERS else {"extra_body": {how: key}}
    )
    messages = opening(f"session {how}")
    first = chat(small_server, messages, **extra)
    for other in range(3):
        chat(small_server, opening(f"passer-by {how} {other}"))
    before = cache_stats(small_server)
    second = chat(small_server, reply(messages, first, "Still there?"), **extra)
    assert cached(second) >= first.usage.prompt_tokens - 2
    after = cache_stats(small_server)
    assert after["session_hits"] == before["session_hits"] + 1


def spilled(cache_dir: Path, tokenizer: Tokenizer, name: str) -> list[Path]:
    """The disk tier's files that hold conversation `name`; spills are written in the background, so wait (bounded)."""
    deadline = time.monotonic() + 20
    while True:
        found = [path for path in cache_dir.glob("*/*.safetensors") if system(name) in _text(path, tokenizer)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _text(path: Path, tokenizer: Tokenizer) -> str:
    try:
        tokens = mx.load(str(path))["tokens"].tolist()
    except (OSError, RuntimeError, ValueError):
        return ""  # being replaced or deleted under us
    return str(tokenizer.decode(tokens, skip_special_tokens=False))


def test_an_evicted_entry_spills_to_disk_and_is_restored(
    disk_server: Server, uncached_server: Server, cache_dir: Path, tokenizer: Tokenizer
) -> None:
    x, y = opening("disk x"), opening("disk y")
    x1 = chat(disk_server, x)
    chat(disk_server, y)  # evicts x: it spills
    assert spilled(cache_dir, tokenizer, "disk x")
    turn2 = reply(x, x1, "Remember me?")
    restored = chat(disk_server, turn2)
    disk = cache_stats(disk_server)["disk"]
    assert disk["restores"] == 1 and disk["last_restore_seconds"] is not None and disk["corrupt"] == 0
    assert cached(restored) >= x1.usage.prompt_tokens - 2
    assert restored.choices[0].message.content == chat(uncached_server, turn2).choices[0].message.content


def test_a_corrupt_file_is_ignored_and_the_request_prefills(
    disk_server: Server, uncached_server: Server, cache_dir: Path, tokenizer: Tokenizer
) -> None:
    z, w = opening("disk z"), opening("disk w")
    z1 = chat(disk_server, z)
    chat(disk_server, w)  # evicts z: it spills
    (path,) = spilled(cache_dir, tokenizer, "disk z")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    before = cache_stats(disk_server)["disk"]
    turn2 = reply(z, z1, "Remember me?")
    answer = chat(disk_server, turn2)
    after = cache_stats(disk_server)["disk"]
    assert after["corrupt"] == before["corrupt"] + 1 and after["restores"] == before["restores"]
    assert cached(answer) < 10 and not path.exists()
    assert answer.choices[0].message.content == chat(uncached_server, turn2).choices[0].message.content


# -- memory admission ---------------------------------------------------------

BUDGET = 4_000_000


@pytest.fixture(scope="module")
def tight_server(server_factory: ServerFactory) -> Server:
    """A budget that leaves room for a few hundred tokens of KV beside the tiny model."""
    return server_factory(memory_budget=str(BUDGET), max_batch="2", prefill_step_size="32")


def fit(server: Server) -> dict[str, Any]:
    response = loopback.get(f"{server.base_url}/fit", timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def test_fit_reports_the_machine_the_split_and_the_largest_safe_context(tight_server: Server) -> None:
    body = fit(tight_server)
    assert set(body) == {"machine", "model", "memory", "decode_tokens_per_s", "kv_scheme", "weights"}
    assert body["kv_scheme"] == "full"  # no --kv-bits
    assert body["machine"]["ram_bytes"] > 0 and body["machine"]["bandwidth_bytes_per_s"] > 0
    memory = body["memory"]
    assert memory["budget_bytes"] == BUDGET and memory["budget_source"] == "MLX_RELAY_MEMORY_BUDGET"
    assert memory["kv_bytes_per_token"] == 2 * 2 * 16 * 2 * 4  # tiny: layers x kv heads x head_dim x K,V x f32
    split = memory["weights_bytes"] + memory["transient_bytes"] + memory["prompt_cache_bytes"] + memory["usable_bytes"]
    assert split == BUDGET
    # The longest row whose KV (whole 256-token blocks) fits beside the prefill working set at that context.
    safe = memory["max_safe_context"]
    assert safe < 2048 and -(-safe // 256) * 256 * memory["kv_bytes_per_token"] <= memory["usable_bytes"]
    # /fit explains the prefill figure: the backend, fused or not, and the formula's inputs.
    working = memory["transient"]
    assert working["backend"] == body["machine"]["backend"] and working["bytes"] == memory["transient_bytes"]
    assert working["prefill_step"] == 32 and working["prefill_rows"] <= 2 and working["formula"]
    assert body["decode_tokens_per_s"]["empty_context"] > body["decode_tokens_per_s"]["max_safe_context"] > 0
    admission = stats(tight_server)["admission"]
    assert isinstance(admission, dict)
    assert admission["max_safe_context"] == memory["max_safe_context"]
    assert (admission["memory_budget_bytes"], admission["usable_bytes"], admission["weights_bytes"]) == (
        BUDGET,
        memory["usable_bytes"],
        memory["weights_bytes"],
    )
    gateway = stats(tight_server)["gateway"]
    assert isinstance(gateway, dict) and gateway["kv_budget_bytes"] == memory["usable_bytes"]


def test_a_request_past_the_budget_gets_context_over_budget(tight_server: Server) -> None:
    safe = fit(tight_server)["memory"]["max_safe_context"]
    client = tight_server.client()
    messages = [{"role": "user", "content": "Hi."}]
    small = chat(tight_server, messages)
    prompt = small.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=messages, max_tokens=safe - prompt + 1)  # type: ignore[arg-type]
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "context_over_budget" and error["param"] == "max_tokens"
    assert str(safe) in error["message"]
    # Without max_tokens the completion may run to the budget, not to the window.
    long_prompt = [{"role": "user", "content": "Tell a story. " * 100}]
    whole = client.chat.completions.create(model="m", messages=long_prompt, temperature=0)  # type: ignore[arg-type]
    assert whole.usage is not None and whole.usage.total_tokens == safe
    assert whole.choices[0].finish_reason == "length"
