"""What a server of several models reports about each: metrics, loads, a model that refused to start, and one
whose worker died before it could say why.

Through real servers: tiny and demo by `MLX_RELAY_MODEL=tiny,demo` (the
server `tests/e2e/test_fleet.py` also uses), and two pinned models from a
models file under a KV scheme one of them cannot serve (demo's worker is
killed there while it starts, then loaded again).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import loopback
from tests.conftest import Server, ServerFactory

pytestmark = pytest.mark.slow
KEY = "unused"
HEADERS = {"authorization": f"Bearer {KEY}"}
TINY, DEMO = "mlx-relay/tiny", "mlx-relay/demo"


@pytest.fixture(scope="module")
def pair(server_factory: ServerFactory) -> Server:
    return server_factory(model="tiny,demo", api_key=KEY, pinned=True)


def scrape(server: Server) -> dict[tuple[str, str], float]:
    """Every sample by (name, model_name); samples with other labels are left out."""
    text = loopback.get(f"{server.base_url}/metrics", headers=HEADERS, timeout=10).text
    return {
        (sample.name, sample.labels.get("model_name", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if set(sample.labels) <= {"model_name"}
    }


def generate(server: Server, model: str, tokens: int) -> None:
    client = server.client()
    client.completions.create(model=model, prompt="Hi", max_tokens=tokens, extra_body={"ignore_eos": True})


def test_metrics_label_each_model_s_series_with_its_name(pair: Server) -> None:
    generate(pair, "tiny", 2)
    generate(pair, "demo", 3)
    before = scrape(pair)
    generate(pair, "tiny", 2)
    generate(pair, "demo", 3)
    after = scrape(pair)

    def moved(name: str, model: str) -> float:
        return after[(name, model)] - before[(name, model)]

    assert moved("vllm:generation_tokens_total", TINY) == 2
    assert moved("vllm:generation_tokens_total", DEMO) == 3
    assert moved("vllm:e2e_request_latency_seconds_count", DEMO) == 1
    # Each loaded model's gauges and counters from its own snapshot (its own worker's steps).
    for model, generated in ((TINY, 4), (DEMO, 6)):
        assert after[("vllm:num_requests_running", model)] == 0
        assert after[("mlx_relay:gateway_generated_tokens_total", model)] >= generated
    # The Responses store is the server's: told once, under no model.
    assert ("mlx_relay:response_store_hits_total", "") in after
    assert ("mlx_relay:response_store_hits_total", TINY) not in after


def test_loads_have_an_entry_per_loaded_model_and_answer_for_one(pair: Server) -> None:
    generate(pair, "tiny", 1)
    generate(pair, "demo", 1)
    body = loopback.get(f"{pair.base_url}/v1/loads", headers=HEADERS, timeout=10).json()
    assert body["dp_rank_count"] == 2
    assert [(load["dp_rank"], load["model"]) for load in body["loads"]] == [(0, TINY), (1, DEMO)]
    assert all(load["max_total_num_tokens"] > 0 and load["num_running_reqs"] == 0 for load in body["loads"])
    one = loopback.get(f"{pair.base_url}/v1/loads", params={"model": "demo"}, headers=HEADERS, timeout=10).json()
    ((load),) = one["loads"]
    assert load["model"] == DEMO and one["dp_rank_count"] == 1
    unknown = loopback.get(f"{pair.base_url}/v1/loads", params={"model": "nope"}, headers=HEADERS, timeout=10)
    assert unknown.status_code == 404


GROUP_SIZE_REFUSAL = "MLX_RELAY_KV_GROUP_SIZE=64"  # tiny's head dim is 16; demo's takes 8-bit groups of 64


@pytest.fixture(scope="module")
def refusing(server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """tiny and demo pinned, under a KV scheme tiny's worker refuses. Its workers are spawned: the crash test below
    needs a worker that is still importing when it is killed, where a forked one has its imports done."""
    models_file = tmp_path_factory.mktemp("refused") / "models.toml"
    models_file.write_text(
        '[models.tiny]\nmodel = "tiny"\npinned = true\n[models.demo]\nmodel = "demo"\npinned = true\n'
    )
    return server_factory(models_file=str(models_file), kv_bits="8", worker_fork="off")


def test_a_model_its_worker_refuses_fails_alone_with_the_reason(refusing: Server) -> None:
    server = refusing
    health = loopback.get(f"{server.base_url}/health", timeout=10)
    assert health.status_code == 200
    reported = health.json()["models"]
    assert reported["tiny"]["state"] == "failed" and GROUP_SIZE_REFUSAL in reported["tiny"]["error"]
    assert reported["demo"]["state"] == "ready"
    cards = {card["id"]: card for card in loopback.get(f"{server.v1}/models", timeout=10).json()["data"]}
    assert cards["tiny"]["state"] == "failed" and GROUP_SIZE_REFUSAL in cards["tiny"]["error"]
    client = server.client()
    answered = client.completions.create(model="demo", prompt="Hi", max_tokens=2, temperature=0)
    assert answered.usage is not None and answered.usage.completion_tokens == 2
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert refused.value.status_code == 503 and GROUP_SIZE_REFUSAL in refused.value.message
    # The refusal is the model's answer: no request starts another worker to be refused again.
    assert loopback.get(f"{server.base_url}/stats", timeout=10).json()["models"]["tiny"]["loads"] == 1


def test_the_one_model_s_refusal_is_in_the_front_s_own_log(server_factory: ServerFactory) -> None:
    with pytest.raises(RuntimeError, match="server exited") as stopped:
        server_factory(private=True, kv_bits="8")
    lines = [line for line in str(stopped.value).splitlines() if '"worker.refused"' in line]
    assert lines and GROUP_SIZE_REFUSAL in lines[0]
    assert '"stage": "remote"' in lines[0]


def worker_processes(server: Server) -> set[int]:
    """The server's model worker processes, spare or serving (hypercorn serves from a child of its own)."""
    parents, workers = {}, set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit():
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if (entry / "comm").read_text().strip() == "relay-worker":
                    workers.add(int(entry.name))

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == server.process.pid:
                return True
        return False

    return {pid for pid in workers if descends(pid)}


def catches_segfaults(pid: int) -> bool:
    """faulthandler is armed (workers/main.py): the process catches SIGSEGV."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGSEGV - 1) & 1)
    return False


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"worker {pid} was not reaped"
        time.sleep(0.02)


def test_a_worker_that_dies_before_it_connects_is_named_by_what_it_printed(refusing: Server) -> None:
    """demo's worker segfaults during its imports: /health, /v1/models and each 503 quote its stderr, no reload loop."""
    server = refusing
    assert admin(server, "demo", "unload").json()["state"] == "unloaded"
    # An idle spare would be taken, already imported and connected: it goes, so demo's load starts a worker.
    # (One may be starting still, from demo's first load: looked for until none is seen for a while.)
    while spares := worker_processes(server):
        for spare in spares:
            os.kill(spare, signal.SIGKILL)
            wait_gone(spare)
        time.sleep(0.5)
    failed: list[openai.APIStatusError] = []

    def ask() -> None:
        with pytest.raises(openai.APIStatusError) as refused:
            server.client().completions.create(model="demo", prompt="Hi", max_tokens=2)
        failed.append(refused.value)

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    deadline = time.monotonic() + 60
    while not (started := [pid for pid in worker_processes(server) if catches_segfaults(pid)]):
        assert time.monotonic() < deadline and asking.is_alive(), "demo's worker never started"
        time.sleep(0.005)
    os.kill(started[0], signal.SIGSEGV)
    asking.join(60)
    (error,) = failed
    assert error.status_code == 503 and error.code == "model_load_failed", error
    for text in (error.message, model_error(server)):
        assert f"pid {started[0]}" in text and "killed by SIGSEGV" in text and "before it connected" in text, text
        assert "Fatal Python error: Segmentation fault" in text, text
    lines = [line for line in server.logs().splitlines() if '"worker.exited"' in line and f"{started[0]}" in line]
    assert lines and "Segmentation fault" in lines[0], lines
    # Its next start would die alike: requests do not start worker after worker; an operator's load does.
    loads = loopback.get(f"{server.base_url}/stats", timeout=10).json()["models"]["demo"]["loads"]
    with pytest.raises(openai.APIStatusError) as again:
        server.client().completions.create(model="demo", prompt="Hi", max_tokens=2)
    assert again.value.status_code == 503 and "SIGSEGV" in again.value.message
    assert loopback.get(f"{server.base_url}/stats", timeout=10).json()["models"]["demo"]["loads"] == loads
    assert admin(server, "demo", "load").json()["state"] == "ready"
    answered = server.client().completions.create(model="demo", prompt="Hi", max_tokens=2, temperature=0)
    assert answered.usage is not None and answered.usage.completion_tokens == 2


def admin(server: Server, name: str, action: str) -> httpx.Response:
    return loopback.post(f"{server.base_url}/admin/models/{name}/{action}", json={}, timeout=120)


def model_error(server: Server) -> str:
    health = loopback.get(f"{server.base_url}/health", timeout=10).json()["models"]["demo"]
    card = {card["id"]: card for card in loopback.get(f"{server.v1}/models", timeout=10).json()["data"]}["demo"]
    assert health["state"] == card["state"] == "failed"
    assert health["error"] == card["error"]
    return str(health["error"])
