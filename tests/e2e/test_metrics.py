"""`/metrics` and `/v1/loads` through a real server: what routers and dashboards read."""

from __future__ import annotations

from pathlib import Path

import openai
from prometheus_client.parser import text_string_to_metric_families

from tests import loopback
from tests.conftest import Server, ServerFactory
from wire.metric_figures import COUNTERS, READ_PATHS

HELLO = [{"role": "user", "content": "Hello"}]


def scrape(server: Server) -> dict[str, float]:
    """Every sample, keyed by name and sorted labels (model_name left out: the one model)."""
    response = loopback.get(f"{server.base_url}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_a_request_moves_vllms_metrics(server: Server, client: openai.OpenAI) -> None:
    before = scrape(server)
    client.chat.completions.create(model="m", messages=HELLO, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    after = scrape(server)

    def moved(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert moved("vllm:time_to_first_token_seconds_count") == 1
    assert moved("vllm:e2e_request_latency_seconds_count") == 1
    assert moved("vllm:request_queue_time_seconds_count") == 1
    assert moved("vllm:inter_token_latency_seconds_count") == 3
    assert moved("vllm:generation_tokens_total") == 4
    assert moved("vllm:request_success_total{finished_reason=length}") == 1
    assert moved("vllm:prefix_cache_queries_total") == moved("vllm:prompt_tokens_total") > 0
    assert moved("vllm:e2e_request_latency_seconds_sum") >= moved("vllm:time_to_first_token_seconds_sum") > 0
    # Idle again: nothing running or waiting, no KV held.
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0


def test_loads_answer_in_the_shape_smg_polls(server: Server, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="m", messages=HELLO, max_tokens=2, temperature=0)  # type: ignore[arg-type]
    response = loopback.get(f"{server.base_url}/v1/loads", params={"include": "core,disagg,queues,memory"}, timeout=10)
    assert response.status_code == 200
    body = response.json()
    assert body["dp_rank_count"] == 1 and isinstance(body["timestamp"], str)
    (load,) = body["loads"]
    assert load["num_running_reqs"] == load["num_waiting_reqs"] == 0
    assert load["max_total_num_tokens"] > 0 and load["max_running_requests"] > 0
    assert 0 <= load["cache_hit_rate"] <= 1 and load["token_usage"] == 0
    assert body["aggregate"]["total_reqs"] == 0


def test_every_stats_path_the_metrics_read_is_in_a_real_snapshot(server_factory: ServerFactory, tmp_path: Path) -> None:
    """The figures read /stats by path; a field renamed in the snapshot must fail here, not read as 0."""
    server = server_factory(cache_dir=str(tmp_path / "cache"), response_store=f"sqlite:///{tmp_path / 'store.db'}")
    client = server.client()
    client.responses.create(model="m", input="Hello", max_output_tokens=2)
    snapshot = loopback.get(f"{server.base_url}/stats", timeout=10).json()
    paths = [tuple(dotted.split(".")) for dotted in COUNTERS] + list(READ_PATHS)
    missing = [".".join(path) for path in paths if not _is_number(_at(snapshot, path))]
    assert not missing, f"/stats has no number at {missing}"


def _at(snapshot: object, path: tuple[str, ...]) -> object:
    for key in path:
        snapshot = snapshot.get(key) if isinstance(snapshot, dict) else None
    return snapshot


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
