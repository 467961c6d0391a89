"""What a server of several models reports about each: metrics, loads, and a model that refused to start.

Through real servers: tiny and demo by `MLX_RELAY_MODEL=tiny,demo` (the
server `tests/e2e/test_fleet.py` also uses), and two pinned models from a
models file under a KV scheme one of them cannot serve.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

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
    text = httpx.get(f"{server.base_url}/metrics", headers=HEADERS, timeout=10).text
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
    body = httpx.get(f"{pair.base_url}/v1/loads", headers=HEADERS, timeout=10).json()
    assert body["dp_rank_count"] == 2
    assert [(load["dp_rank"], load["model"]) for load in body["loads"]] == [(0, TINY), (1, DEMO)]
    assert all(load["max_total_num_tokens"] > 0 and load["num_running_reqs"] == 0 for load in body["loads"])
    one = httpx.get(f"{pair.base_url}/v1/loads", params={"model": "demo"}, headers=HEADERS, timeout=10).json()
    ((load),) = one["loads"]
    assert load["model"] == DEMO and one["dp_rank_count"] == 1
    unknown = httpx.get(f"{pair.base_url}/v1/loads", params={"model": "nope"}, headers=HEADERS, timeout=10)
    assert unknown.status_code == 404


GROUP_SIZE_REFUSAL = "MLX_RELAY_KV_GROUP_SIZE=64"  # tiny's head dim is 16; demo's takes 8-bit groups of 64


def test_a_model_its_worker_refuses_fails_alone_with_the_reason(
    server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    models_file = tmp_path_factory.mktemp("refused") / "models.toml"
    models_file.write_text(
        '[models.tiny]\nmodel = "tiny"\npinned = true\n[models.demo]\nmodel = "demo"\npinned = true\n'
    )
    server = server_factory(models_file=str(models_file), kv_bits="8")
    health = httpx.get(f"{server.base_url}/health", timeout=10)
    assert health.status_code == 200
    reported = health.json()["models"]
    assert reported["tiny"]["state"] == "failed" and GROUP_SIZE_REFUSAL in reported["tiny"]["error"]
    assert reported["demo"]["state"] == "ready"
    cards = {card["id"]: card for card in httpx.get(f"{server.v1}/models", timeout=10).json()["data"]}
    assert cards["tiny"]["state"] == "failed" and GROUP_SIZE_REFUSAL in cards["tiny"]["error"]
    client = server.client()
    assert client.completions.create(model="demo", prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert refused.value.status_code == 503 and GROUP_SIZE_REFUSAL in refused.value.message
    # The refusal is the model's answer: no request starts another worker to be refused again.
    assert httpx.get(f"{server.base_url}/stats", timeout=10).json()["models"]["tiny"]["loads"] == 1


def test_the_one_model_s_refusal_is_in_the_front_s_own_log(server_factory: ServerFactory) -> None:
    with pytest.raises(RuntimeError, match="server exited") as stopped:
        server_factory(private=True, kv_bits="8")
    lines = [line for line in str(stopped.value).splitlines() if '"worker.refused"' in line]
    assert lines and GROUP_SIZE_REFUSAL in lines[0]
    assert '"stage": "remote"' in lines[0]
