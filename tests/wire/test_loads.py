"""`GET /v1/loads` in the shape SGLang serves and smg polls."""

from __future__ import annotations

from wire.loads import LoadInputs, loads_body

_SGLANG_LOAD_FIELDS = {
    "dp_rank",
    "num_running_reqs",
    "num_waiting_reqs",
    "num_used_tokens",
    "num_total_tokens",
    "max_total_num_tokens",
    "max_running_requests",
    "token_usage",
    "gen_throughput",
    "cache_hit_rate",
    "utilization",
}


def test_the_figures_map_onto_sglangs_fields() -> None:
    snapshot = {
        "admission": {"in_flight": 3},
        "gateway": {"active": 2, "kv_held_bytes": 4096, "kv_budget_bytes": 16384},
    }
    body = loads_body(
        [
            LoadInputs(
                snapshot=snapshot,
                kv_bytes_per_token=16,
                max_running_requests=8,
                gen_throughput=12.345,
                cache_hit_rate=0.123456,
            )
        ],
        version="v",
        now=0.0,
    )
    assert body["timestamp"] == "1970-01-01T00:00:00+00:00" and body["dp_rank_count"] == 1
    (load,) = body["loads"]  # type: ignore[misc]
    assert set(load) >= _SGLANG_LOAD_FIELDS
    # Not measured before admission, so not reported rather than reported as a constant 0.
    assert "num_waiting_uncached_tokens" not in load
    assert load == {
        "dp_rank": 0,
        "num_running_reqs": 2,
        "num_waiting_reqs": 1,
        "num_total_reqs": 3,
        "num_used_tokens": 256,
        "num_total_tokens": 256,
        "max_total_num_tokens": 1024,
        "max_running_requests": 8,
        "token_usage": 0.25,
        "gen_throughput": 12.35,
        "cache_hit_rate": 0.1235,
        "utilization": 0.25,
    }
    assert body["aggregate"] == {
        "total_running_reqs": 2,
        "total_waiting_reqs": 1,
        "total_reqs": 3,
        "avg_token_usage": 0.25,
        "avg_throughput": 12.35,
        "avg_utilization": 0.25,
    }


def test_several_models_are_an_entry_each_named_and_summed() -> None:
    busy = {"admission": {"in_flight": 3}, "gateway": {"active": 2, "kv_held_bytes": 4096, "kv_budget_bytes": 16384}}
    idle = {"admission": {"in_flight": 0}, "gateway": {"active": 0, "kv_held_bytes": 0, "kv_budget_bytes": 8192}}
    tiny = LoadInputs(
        snapshot=busy,
        kv_bytes_per_token=16,
        max_running_requests=8,
        gen_throughput=10.0,
        cache_hit_rate=0.5,
        model="tiny",
    )
    demo = LoadInputs(
        snapshot=idle,
        kv_bytes_per_token=32,
        max_running_requests=4,
        gen_throughput=0.0,
        cache_hit_rate=0.0,
        model="demo",
    )
    body = loads_body([tiny, demo], version="v", now=0.0)
    assert body["dp_rank_count"] == 2
    first, second = body["loads"]  # type: ignore[misc]
    assert (first["model"], first["dp_rank"], second["model"], second["dp_rank"]) == ("tiny", 0, "demo", 1)
    assert second["max_total_num_tokens"] == 256 and second["num_running_reqs"] == 0
    assert body["aggregate"] == {
        "total_running_reqs": 2,
        "total_waiting_reqs": 1,
        "total_reqs": 3,
        "avg_token_usage": 0.125,
        "avg_throughput": 5.0,
        "avg_utilization": 0.125,
    }
