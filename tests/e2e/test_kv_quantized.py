"""A quantized KV cache (MLX_RELAY_KV_BITS) end to end, through hypercorn, on the demo model (preemption on tiny-hd64).

The batch, preemption and resumption, the prompt cache and its disk tier
run with 8-bit KV; /fit and /stats name the scheme and price it; a disk
entry written under one scheme is never restored under another; every
combination that cannot run is refused at start, naming it.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest

from pipeline.settings import Settings
from stages.engine.decisions import open_disk
from stages.kv.machine import read_machine
from stages.kv.plan import budget_for
from stages.kv.shape import KvScheme, read_model_shape
from stages.models.loading import resolve_model
from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats
from tests.e2e.test_concurrency import stream_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

Q8 = {"model": "demo", "kv_bits": "8"}


def story(name: str, words: int = 150) -> list[dict[str, str]]:
    text = " ".join(f"{name} fact {i} is remembered here." for i in range(words // 5))
    return [{"role": "system", "content": text}, {"role": "user", "content": f"Tell me about {name}."}]


def chat(server: Server, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    body = {"model": "demo", "messages": messages, "max_tokens": 12, "temperature": 0, **extra}
    response = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def cached(reply: dict[str, Any]) -> int:
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.fixture(scope="module")
def full(server_factory: ServerFactory) -> Server:
    return server_factory(model="demo")


@pytest.fixture(scope="module")
def quantized(server_factory: ServerFactory) -> Server:
    return server_factory(**Q8)


def test_fit_and_stats_name_the_scheme_and_price_it(full: Server, quantized: Server) -> None:
    plain, q8 = (loopback.get(f"{server.base_url}/fit", timeout=10).json() for server in (full, quantized))
    assert plain["kv_scheme"] == "full" and q8["kv_scheme"] == "q8g64"
    assert q8["model"]["kv_scheme"] == {"bits": 8, "group_size": 64}
    # demo: 8 layers x 4 KV heads x 64 dims, float32; 8 bits and a float32 scale and bias per 64 values.
    assert plain["memory"]["kv_bytes_per_token"] == 8 * 4 * 2 * 64 * 4
    assert q8["memory"]["kv_bytes_per_token"] == 8 * 4 * 2 * (64 + 2 * 4)
    reported = stats(quantized)["kv_scheme"]
    assert reported == {
        "name": "q8g64",
        "bits": 8,
        "group_size": 64,
        "kv_bytes_per_token": q8["memory"]["kv_bytes_per_token"],
    }
    assert stats(full)["kv_scheme"]["name"] == "full"  # type: ignore[index]


def test_quantized_rows_answer_and_a_second_turn_hits_the_prompt_cache(quantized: Server) -> None:
    messages = story("hit")
    first = chat(quantized, messages)
    assert first["choices"][0]["finish_reason"] in ("stop", "length") and first["usage"]["completion_tokens"] > 0
    again = chat(quantized, messages)
    assert cached(again) >= first["usage"]["prompt_tokens"] - 2
    # The same quantized KV, computed or cached, gives the same greedy tokens.
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    streamed, finish = stream_text(
        quantized, {"model": "demo", "messages": story("stream"), "max_tokens": 8, "temperature": 0}
    )
    assert finish in ("stop", "length") and isinstance(streamed, str)


def test_quantized_kv_changes_the_arithmetic_not_the_shape_of_answers(full: Server, quantized: Server) -> None:
    """Rows batched together each get a well-formed answer; the cache's scheme is the only difference."""
    bodies = [
        {"model": "demo", "messages": story(f"row {i}"), "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        for i in range(4)
    ]
    barrier = threading.Barrier(len(bodies))
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: stream_text(quantized, body, barrier), bodies))
    assert all(finish == "length" and text for text, finish in answers)


def test_preempted_quantized_rows_resume_with_the_same_text(server_factory: ServerFactory) -> None:
    # Hundreds of tokens a row on six rows, twice: on a model whose heads take 8-bit groups, at a tenth of demo's cost.
    model = "tiny-hd64"
    rows = 6
    info = resolve_model(model)
    shape = read_model_shape(info.path, info.context_window)
    q8 = attrs.evolve(shape, kv_scheme=KvScheme(bits=8))
    budget = budget_for(
        q8, read_machine(), rows * q8.kv_bytes(300), prompt_cache=32 << 20, max_batch=rows, prefill_step=512
    )
    roomy = server_factory(model=model, kv_bits="8")
    tight = server_factory(
        model=model, kv_bits="8", memory_budget=str(budget), prompt_cache_bytes=str(32 << 20), max_batch=str(rows)
    )
    bodies = [
        {
            "model": model,
            "messages": story(f"pressed {i}", 40),
            "max_tokens": 420,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(rows)
    ]

    def run(server: Server) -> list[tuple[str, str]]:
        barrier = threading.Barrier(rows)
        with ThreadPoolExecutor(rows) as pool:
            return list(pool.map(lambda body: stream_text(server, body, barrier), bodies))

    pressed = run(tight)
    gateway = stats(tight)["gateway"]
    assert gateway["preemptions"] > 0 and gateway["resumed"] == gateway["preemptions"]  # type: ignore[index]
    assert pressed == run(roomy)


def test_the_disk_tier_restores_its_own_scheme_and_never_another(server_factory: ServerFactory, tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    entry = 2 * 150 * 8 * 4 * 2 * (64 + 8)  # two conversations' worth would not fit: the first spills
    writer = server_factory(private=True, **Q8, cache_dir=str(disk), prompt_cache_bytes=str(entry))
    x, y = story("disk x"), story("disk y")
    first = chat(writer, x)
    chat(writer, y)
    files = _wait_for_files(disk)
    writer.kill()
    assert files, "nothing spilled"
    (folder,) = {path.parent for path in files}
    assert folder == _folder_for(disk, {"kv_bits": "8"})
    header = files[0].read_bytes()[8:4096]
    assert b'"kv_scheme": "q8g64"' in header
    # The same scheme restores the entry: a fresh server's first request hits it on disk.
    reader = server_factory(private=True, **Q8, cache_dir=str(disk))
    again = chat(reader, x)
    assert cached(again) >= first["usage"]["prompt_tokens"] - 2
    assert stats(reader)["prompt_cache"]["disk"]["restores"] >= 1  # type: ignore[index]
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    reader.kill()
    # Another scheme never restores it, even with the file put where its own entries live.
    for other in ({"kv_bits": "4"}, {}):
        foreign = tmp_path / f"foreign-{other.get('kv_bits', 'full')}"
        own = _folder_for(foreign, other)
        assert own.name != folder.name
        own.mkdir(parents=True)
        for path in folder.glob("*.safetensors"):
            shutil.copy(path, own / path.name)
        server = server_factory(private=True, model="demo", cache_dir=str(foreign), **other)
        assert cached(chat(server, x)) < 10
        disk_stats = stats(server)["prompt_cache"]["disk"]  # type: ignore[index]
        assert disk_stats["restores"] == 0 and disk_stats["corrupt"] >= 1  # type: ignore[index]
        # It read that folder as its own: the server made no other.
        assert [path for path in foreign.iterdir() if path.is_dir()] == [own]
        server.kill()


def _wait_for_files(disk: Path) -> list[Path]:
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = sorted(disk.glob("*/*.safetensors"))
        if found:
            return found
        time.sleep(0.1)
    return []


def _folder_for(root: Path, settings: dict[str, str]) -> Path:
    """The folder a demo server with `settings` files its entries in (one per model fingerprint and KV scheme),
    from the function the server itself calls."""
    env = {f"MLX_RELAY_{name.upper()}": value for name, value in settings.items()}
    served = Settings.from_env({**env, "MLX_RELAY_MODEL": "demo", "MLX_RELAY_CACHE_DIR": str(root)})
    disk = open_disk(served, resolve_model("demo").path, None)
    assert disk is not None
    return disk.root


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"kv_bits": "8"}, "MLX_RELAY_KV_GROUP_SIZE=64"),  # tiny: head dim 16
        ({"model": "demo", "kv_bits": "8", "quantized_kv_start": "256"}, "MLX_RELAY_QUANTIZED_KV_START=256"),
        ({"model": "shaped:gemma3-1b-6l", "kv_bits": "8"}, "RotatingKVCache"),
        ({"model": "shaped:qwen3.5-0.8b-4l", "kv_bits": "4"}, "ArraysCache"),
        ({"model": "demo", "kv_bits": "3"}, "kv_bits"),
    ],
    ids=["group-size", "quantized-start", "sliding-window", "recurrent", "bits"],
)
def test_what_cannot_run_is_refused_at_start_naming_it(
    server_factory: ServerFactory, settings: dict[str, str], named: str
) -> None:
    # In the HTTP process, so the refusal's words are in the server's own log; a model worker's refusal
    # crosses to the front's log too (tests/e2e/test_fleet_reports.py).
    with pytest.raises(RuntimeError, match="server exited") as refused:
        server_factory(private=True, in_process="1", **settings)
    assert named in str(refused.value)


def test_eight_bit_kv_through_fit_on_a_qwen3_shaped_model_under_twelve_gib(server_factory: ServerFactory) -> None:
    """The issue's measure, read from /fit of real servers: Qwen3-0.6B's published shape, 28 layers, 12 GiB.

    The weights as stored (4-bit), as Metal serves them, so the KV is bfloat16: the narrower gap between full
    and 8-bit KV (float32 KV, which the CPU backend's dequantized weights compute, is 3.6x an 8-bit entry).
    """
    from stages.models.shaped import ensure_shaped_model

    ensure_shaped_model("qwen3-0.6b")
    stored = {"model": "shaped:qwen3-0.6b", "memory_budget": str(12 << 30), "keep_quantized": "1"}
    fits = {
        bits: loopback.get(f"{server_factory(**stored, **extra).base_url}/fit", timeout=30).json()
        for bits, extra in (("full", {}), ("8", {"kv_bits": "8"}))
    }
    assert fits["full"]["memory"]["kv_bytes_per_token"] == 28 * 8 * 128 * 2 * 2  # layers, KV heads, dims, K+V, bf16
    full, q8 = fits["full"]["memory"], fits["8"]["memory"]
    window = fits["full"]["model"]["context_window"]
    assert full["kv_bytes_per_token"] >= 1.8 * q8["kv_bytes_per_token"]
    # 1.8x the full-precision row, or the model's whole window where that is less.
    assert q8["max_safe_context"] >= min(window, 1.8 * full["max_safe_context"])
    # Rows of 4k tokens (and a block to grow) that the KV room holds.
    rows = {
        name: fit["memory"]["usable_bytes"] // fit["memory"]["kv_bytes_per_token"] // (4096 + 256)
        for name, fit in fits.items()
    }
    assert rows["8"] >= max(16, 1.8 * rows["full"])
