"""The `/stats` snapshot as metric figures: vLLM's load gauges and our own `mlx_relay:` ones."""

from __future__ import annotations

import attrs
import pytest

from edge.batch_runner import BatchProgress, BatchStatistics
from pipeline.requests import JsonObject
from wire.metric_figures import Figure, snapshot_metrics

_VLLM = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:num_preemptions"}


def ours(snapshot: JsonObject) -> list[Figure]:
    return [figure for figure in snapshot_metrics(snapshot) if figure.name not in _VLLM]


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        ({"submitted": 3}, [Figure("mlx_relay:submitted", "/stats submitted", 3.0, counter=True)]),
        (
            {"gateway": {"active": 2, "kv_held_bytes": 1.5}},
            [
                Figure("mlx_relay:gateway_active", "/stats gateway.active", 2.0),
                Figure("mlx_relay:gateway_kv_held_bytes", "/stats gateway.kv_held_bytes", 1.5),
            ],
        ),
        (
            {"running": True, "dead": False},
            [Figure("mlx_relay:running", "/stats running", 1.0), Figure("mlx_relay:dead", "/stats dead", 0.0)],
        ),
        ({"model": "m", "last": None, "nan": float("nan")}, []),
        (
            {"prompt_cache": {"disk": {"spills": 7}}},
            [Figure("mlx_relay:prompt_cache_disk_spills", "/stats prompt_cache.disk.spills", 7.0, counter=True)],
        ),
        (
            {"prompt-cache": {"disk.bytes": 7}},
            [Figure("mlx_relay:prompt_cache_disk_bytes", "/stats prompt-cache.disk.bytes", 7.0)],
        ),
    ],
    ids=["counter", "nested-gauges", "bools", "skipped", "nested-counter", "unsafe-names"],
)
def test_numbers_become_figures_by_path(snapshot: JsonObject, expected: list[Figure]) -> None:
    assert ours(snapshot) == expected


def test_the_vllm_load_gauges_come_from_the_gateway_and_admission() -> None:
    snapshot: JsonObject = {
        "admission": {"in_flight": 5},
        "gateway": {"active": 2, "kv_held_bytes": 256, "kv_budget_bytes": 1024, "preemptions": 3},
    }
    vllm = {
        figure.name: (figure.value, figure.counter) for figure in snapshot_metrics(snapshot) if figure.name in _VLLM
    }
    assert vllm == {
        "vllm:num_requests_running": (2, False),
        "vllm:num_requests_waiting": (3, False),
        "vllm:kv_cache_usage_perc": (0.25, False),
        "vllm:num_preemptions": (3, True),
    }


def test_an_empty_snapshot_reports_an_idle_server() -> None:
    vllm = {figure.name: figure.value for figure in snapshot_metrics({}) if figure.name in _VLLM}
    assert vllm == dict.fromkeys(_VLLM, 0)


def test_batch_progress_counts_lines_and_gauges_the_batches_in_progress() -> None:
    """The runner's own statistics, as /stats carries them: lines written are counters, batches a gauge."""
    progress = BatchProgress(id="batch_1", status="in_progress", total=9, completed=7, failed=1)
    statistics = BatchStatistics(
        running=(progress,),
        in_progress=1,
        rows_in_flight=1,
        lines_completed=7,
        lines_failed=1,
        live_limit=2,
        max_rows=2,
    )
    figures = {figure.name: (figure.value, figure.counter) for figure in ours({"batches": attrs.asdict(statistics)})}
    assert figures["mlx_relay:batches_lines_completed"] == (7.0, True)
    assert figures["mlx_relay:batches_lines_failed"] == (1.0, True)
    assert figures["mlx_relay:batches_in_progress"] == (1.0, False)
    assert figures["mlx_relay:batches_rows_in_flight"] == (1.0, False)
