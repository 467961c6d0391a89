"""Sixteen streams without max_tokens, through hypercorn, with an ample and a tight KV budget.

With room, all sixteen run together (`/stats` shows 16 active rows). With a
budget that holds sixteen rows only while they are short, rows are
preempted as they grow and resumed later: `/stats` counts both, nothing
crashes, and every stream's text equals the row's answer with room.

The same sixteen start together on a Qwen3-0.6B-shaped 4-bit model (its
published attention shape: 8 KV heads of 128, 2 of its 28 layers so it
builds in seconds) under a 12 GiB budget at the default settings, with the
model's full 40,960-token window as the longest safe row.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stages.kv.machine import read_machine
from stages.kv.plan import budget_for as plan_budget_for
from stages.kv.shape import ModelShape, read_model_shape
from stages.models.loading import resolve_model
from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats
from tests.e2e.test_concurrency import stream_text

# Sixteen streams of hundreds of tokens, twice, on a shared CPU: minutes, not seconds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROWS = 16
PROMPT_CACHE = 32 << 20
# Tokens each row of the preemption test generates (its docstring says why so many).
ROW_TOKENS = 1000


def bodies(max_tokens: int | None) -> list[dict[str, object]]:
    # With a limit every row runs to it: a random model's early EOS would leave the rest room to grow unpreempted.
    limit = {} if max_tokens is None else {"max_tokens": max_tokens, "ignore_eos": True}
    return [
        {"messages": [{"role": "user", "content": f"Tell me about {i}."}], "temperature": 0.0, **limit}
        for i in range(ROWS)
    ]


def budget_for(shape: ModelShape, usable: int) -> int:
    """The smallest MLX_RELAY_MEMORY_BUDGET whose plan leaves `usable` bytes for the batch's KV."""
    return plan_budget_for(shape, read_machine(), usable, prompt_cache=PROMPT_CACHE, max_batch=ROWS, prefill_step=512)


def whole_text(server: Server, body: dict[str, object], barrier: threading.Barrier) -> tuple[str, str]:
    """One request's text and finish, answered whole: the reference the pressed streams must match (as streamed,
    16,000 events cost the client and the front seconds of CPU for the same text)."""
    barrier.wait(timeout=30)
    response = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    return choice["message"]["content"] or "", choice["finish_reason"]


def run_all(server: Server, max_tokens: int | None, *, stream: bool = True) -> tuple[list[tuple[str, str]], int]:
    """Every row's text and finish (streamed, or answered whole), and the most rows /stats saw running at once."""
    seen, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen[0] = max(seen[0], int(stats(server)["gateway"]["active"]))  # type: ignore[index]
            time.sleep(0.05)

    barrier = threading.Barrier(ROWS)
    with ThreadPoolExecutor(ROWS + 1) as pool:
        watcher = pool.submit(watch)
        try:
            ask = stream_text if stream else whole_text
            results = list(pool.map(lambda body: ask(server, body, barrier), bodies(max_tokens)))
        finally:
            done.set()
        watcher.result()
    return results, seen[0]


@pytest.fixture(scope="module")
def ample(server_factory: ServerFactory, tiny_model: Path) -> Server:
    """The tiny model with room for sixteen rows at its full window: none waits for memory or is preempted.

    One server for both tests that need the room (a start is about 4 s here)."""
    info = resolve_model(str(tiny_model))
    shape = read_model_shape(info.path, info.context_window)
    return server_factory(
        memory_budget=str(budget_for(shape, ROWS * shape.kv_bytes(info.context_window + 256))),
        prompt_cache_bytes=str(PROMPT_CACHE),
    )


def test_sixteen_streams_without_max_tokens_run_together_where_they_fit(ample: Server) -> None:
    """Room for sixteen rows at the full window: all sixteen start at once (then the clients leave)."""
    assert_sixteen_start_together(ample)


def test_sixteen_streams_on_a_qwen3_shaped_model_under_twelve_gib(server_factory: ServerFactory) -> None:
    """The issue's case: a real model's shape, a 12 GiB budget, default settings, no max_tokens."""
    from stages.models.shaped import ensure_shaped_model

    ensure_shaped_model("qwen3-0.6b-2l")
    server = server_factory(model="shaped:qwen3-0.6b-2l", memory_budget=str(12 << 30))
    fit = loopback.get(f"{server.base_url}/fit", timeout=10).json()
    assert fit["memory"]["max_safe_context"] == 40960
    assert_sixteen_start_together(server)


def assert_sixteen_start_together(server: Server) -> None:
    leave, started = threading.Event(), threading.Barrier(ROWS)

    def stream(body: dict[str, object]) -> int:
        started.wait(timeout=30)
        chunks = 0
        with loopback.stream(
            "POST", f"{server.v1}/chat/completions", json={**body, "stream": True}, timeout=300
        ) as response:
            for _ in response.iter_lines():
                chunks += 1
                if leave.is_set():
                    break
        return chunks

    with ThreadPoolExecutor(ROWS) as pool:
        streams = [pool.submit(stream, body) for body in bodies(None)]
        deadline, most = time.monotonic() + 240, 0
        while most < ROWS and time.monotonic() < deadline:
            gateway = stats(server)["gateway"]
            most = max(most, int(gateway["active"]))  # type: ignore[index]
            time.sleep(0.05)
        leave.set()
        assert all(stream.result() > 0 for stream in streams)
    assert most == ROWS
    assert gateway["waiting_for_memory"] == 0 and gateway["preemptions"] == 0  # type: ignore[index]


def test_a_budget_too_small_for_sixteen_growing_rows_preempts_and_resumes_them(
    server_factory: ServerFactory, tiny_model: Path, ample: Server
) -> None:
    """Sixteen rows fit while they are under 400 tokens: past it, the latest arrivals yield and come back.

    How many run at once depends on arrival: a row that arrives after the
    others have grown waits for room (the scheduler's job), so only "more
    than one" is asserted here; sixteen starting together is the test above.
    The budget holds 8,192 tokens of blocks; a row of 1,000 tokens holds
    1,024, so at most eight rows can run to their end together. A loaded
    machine staggers the clients, and a row that arrives once the others
    have filled the budget waits instead of being preempted (at 540 tokens a
    stagger of about 300 steps was enough for that, and one clean-clone run
    saw no preemption). At 1,000, the ninth row admitted while the others
    are short forces a preemption unless the rows arrive about 900 steps apart.
    """
    info = resolve_model(str(tiny_model))
    shape = read_model_shape(info.path, info.context_window)
    free, _ = run_all(ample, ROW_TOKENS, stream=False)
    assert stats(ample)["gateway"]["preemptions"] == 0  # type: ignore[index]
    tight = server_factory(
        memory_budget=str(budget_for(shape, ROWS * shape.kv_bytes(400))), prompt_cache_bytes=str(PROMPT_CACHE)
    )
    fit = loopback.get(f"{tight.base_url}/fit", timeout=10).json()
    assert fit["memory"]["max_safe_context"] == info.context_window
    assert fit["memory"]["transient"]["backend"] == fit["machine"]["backend"]
    pressed, most = run_all(tight, ROW_TOKENS)
    assert most > 1
    gateway = stats(tight)["gateway"]
    assert gateway["preemptions"] > 0 and gateway["resumed"] == gateway["preemptions"]  # type: ignore[index]
    assert gateway["kv_held_bytes"] == 0 and gateway["active"] == 0  # type: ignore[index]
    assert pressed == free
