"""The Prometheus exporter: vLLM's names and types, read back with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from edge.metrics import Metrics
from pipeline.observe import RequestRecord

_SNAPSHOT = {
    "blas": "openblas",
    "submitted": 4,
    "admission": {"in_flight": 1},
    "gateway": {"active": 1, "kv_held_bytes": 10, "kv_budget_bytes": 40, "preemptions": 0, "generated_tokens": 9},
}


def record(**changes: object) -> RequestRecord:
    values: dict[str, object] = {
        "request_id": "r1",
        "finish_reason": "length",
        "prompt_tokens": 30,
        "completion_tokens": 4,
        "cached_tokens": 20,
        "queue": 0.01,
        "prefill": 0.2,
        "decode": 0.3,
        "first_token": 0.25,
        "total": 0.55,
    }
    values.update(changes)
    return RequestRecord(**values)  # type: ignore[arg-type]


def scrape(metrics: Metrics) -> tuple[dict[str, str], list[Sample]]:
    families = list(text_string_to_metric_families(metrics.render({"tiny": _SNAPSHOT}).decode()))
    return {family.name: family.type for family in families}, [
        sample for family in families for sample in family.samples
    ]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    (found,) = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return found


def configured() -> Metrics:
    metrics = Metrics()
    metrics.configure(model_names=["tiny"], context_window=2048)
    return metrics


def test_requests_feed_vllms_histograms_and_counters() -> None:
    metrics = configured()
    metrics.observer("tiny").finished(record())
    metrics.observer("tiny").finished(record(finish_reason="stop", cached_tokens=0))
    metrics.observer("tiny").token_gap(0.02)
    types, samples = scrape(metrics)
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ):
        assert types[name] == "histogram", name
    for name in (
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
    ):
        assert types[name] == "counter", name
    assert value(samples, "vllm:time_to_first_token_seconds_count", model_name="tiny") == 2
    assert value(samples, "vllm:time_to_first_token_seconds_sum", model_name="tiny") == 0.5
    assert value(samples, "vllm:inter_token_latency_seconds_count", model_name="tiny") == 1
    assert value(samples, "vllm:request_success_total", finished_reason="length") == 1
    assert value(samples, "vllm:request_success_total", finished_reason="stop") == 1
    assert value(samples, "vllm:prompt_tokens_total") == 60 and value(samples, "vllm:generation_tokens_total") == 8
    assert (
        value(samples, "vllm:prefix_cache_queries_total") == 60 and value(samples, "vllm:prefix_cache_hits_total") == 20
    )
    assert metrics.cache_hit_rate("tiny") == 20 / 60


def test_an_aborted_row_counts_without_the_spans_it_never_reached() -> None:
    metrics = configured()
    aborted = record(finish_reason="abort", prefill=None, decode=None, first_token=None, total=None)
    metrics.observer("tiny").finished(aborted)
    _, samples = scrape(metrics)
    assert value(samples, "vllm:request_success_total", finished_reason="abort") == 1
    assert value(samples, "vllm:time_to_first_token_seconds_count") == 0
    assert value(samples, "vllm:request_queue_time_seconds_count") == 1


def test_the_snapshot_gives_gauges_and_typed_counters_of_our_own() -> None:
    types, samples = scrape(configured())
    assert types["vllm:num_requests_running"] == types["vllm:kv_cache_usage_perc"] == "gauge"
    assert value(samples, "vllm:num_requests_running", model_name="tiny") == 1
    assert value(samples, "vllm:num_requests_waiting") == 0
    assert value(samples, "vllm:kv_cache_usage_perc") == 0.25
    assert types["mlx_relay:submitted"] == "counter" and value(samples, "mlx_relay:submitted_total") == 4
    assert types["mlx_relay:gateway_active"] == "gauge"
    assert value(samples, "mlx_relay:build_info", blas="openblas", model_name="tiny") == 1


def test_the_throughput_is_measured_between_polls() -> None:
    metrics = configured()
    assert metrics.gen_throughput("tiny", 100, now=10.0) == 0.0
    assert metrics.gen_throughput("tiny", 150, now=12.0) == 25.0
    assert metrics.gen_throughput("tiny", 150, now=12.0) == 0.0


def test_two_apps_never_share_a_series() -> None:
    first, second = configured(), configured()
    first.observer("tiny").finished(record())
    _, samples = scrape(second)
    assert value(samples, "vllm:prompt_tokens_total") == 0


def test_every_metric_the_dashboard_reads_is_exported() -> None:
    import json
    import re

    from tests.conftest import REPO

    dashboard = json.loads((REPO / "deploy" / "grafana" / "mlx-relay.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    read = {name for expr in exprs for name in re.findall(r"(?:vllm|mlx_relay):[a-z0-9_]+", expr)}
    snapshot = {
        **_SNAPSHOT,
        "admission": {"in_flight": 0, "refused": 0},
        "gateway": {**_SNAPSHOT["gateway"], "mlx_active_bytes": 0, "mlx_cache_bytes": 0},  # type: ignore[dict-item]
        "prompt_cache": {"bytes": 0, "disk": {"bytes": 0, "spills": 0, "restores": 0}},
    }
    text = configured().render({"tiny": snapshot}).decode()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    # A histogram is read through its _bucket series.
    assert read - exported == set()


def test_each_model_has_its_own_series_and_the_store_is_told_once() -> None:
    metrics = Metrics()
    metrics.configure(model_names=["tiny", "demo"], context_window=4096)
    metrics.observer("demo").finished(record(prompt_tokens=7))
    busy = {**_SNAPSHOT, "gateway": {**_SNAPSHOT["gateway"], "active": 3}}  # type: ignore[dict-item]
    text = metrics.render({"tiny": _SNAPSHOT, "demo": busy}, {"response_store": {"hits": 2}}).decode()
    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    assert value(samples, "vllm:prompt_tokens_total", model_name="demo") == 7
    assert value(samples, "vllm:prompt_tokens_total", model_name="tiny") == 0
    assert value(samples, "vllm:num_requests_running", model_name="tiny") == 1
    assert value(samples, "vllm:num_requests_running", model_name="demo") == 3
    assert value(samples, "mlx_relay:response_store_hits_total") == 2
    assert metrics.cache_hit_rate("demo") == 20 / 7 and metrics.cache_hit_rate("tiny") == 0
