"""The `/stats` snapshot as metric figures: vLLM's load gauges, and ours under `mlx_relay:`.

Pure; no I/O and no metrics library (`edge/metrics.py` exports them).
vLLM's gauges are the ones routers read for load: `num_requests_running`
(rows in the batch), `num_requests_waiting` (admitted, not yet running)
and `kv_cache_usage_perc` (the KV the running rows hold over the KV
budget, a fraction like vLLM's). Every other number in the snapshot
becomes an `mlx_relay:` figure named by its path
(`gateway.active` → `mlx_relay:gateway_active`); the paths in `COUNTERS`
only grow, so they are counters, the rest gauges; booleans are 0 or 1;
strings and missing values are left out.
"""

from __future__ import annotations

import math
import re

import attrs

from pipeline.requests import JsonObject, JsonValue

PREFIX = "mlx_relay:"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")

COUNTERS = frozenset(
    {
        "submitted",
        "admission.refused",
        "gateway.steps",
        "gateway.generated_tokens",
        "gateway.preemptions",
        "gateway.resumed",
        "gateway.steps_over_budget",
        "prompt_cache.hits",
        "prompt_cache.misses",
        "prompt_cache.cached_tokens",
        "prompt_cache.session_hits",
        "prompt_cache.session_misses",
        "prompt_cache.evictions",
        "prompt_cache.disk.spills",
        "prompt_cache.disk.spills_dropped",
        "prompt_cache.disk.spill_errors",
        "prompt_cache.disk.spills_unsupported",
        "prompt_cache.disk.restores",
        "prompt_cache.disk.corrupt",
        "response_store.hits",
        "response_store.misses",
        "response_store.evictions",
        "response_store.expirations",
        "response_store.oversized",
        # Batch API lines written since the server started (edge/batch_runner.py); `batches.in_progress` is a gauge.
        "batches.lines_completed",
        "batches.lines_failed",
    }
)


# The paths read by name besides the generic walk; tests/e2e/test_metrics.py finds each, and every
# path in COUNTERS, in a real server's /stats, so a renamed field cannot silently read as 0.
RUNNING = ("gateway", "active")
ADMITTED = ("admission", "in_flight")
KV_HELD = ("gateway", "kv_held_bytes")
KV_BUDGET = ("gateway", "kv_budget_bytes")
PREEMPTIONS = ("gateway", "preemptions")
READ_PATHS = (RUNNING, ADMITTED, KV_HELD, KV_BUDGET, PREEMPTIONS)
# Speculative decoding's counters under vLLM's spec_decode names; absent from /stats (and here) when it is off,
# so tests/e2e/test_speculation.py, not test_metrics.py, finds each in a speculating server's snapshot.
SPEC_DECODE = (
    ("vllm:spec_decode_num_drafts", "Steps in which a row proposed tokens", ("gateway", "speculation", "drafts")),
    ("vllm:spec_decode_num_draft_tokens", "Tokens proposed", ("gateway", "speculation", "proposed_tokens")),
    (
        "vllm:spec_decode_num_accepted_tokens",
        "Proposed tokens the target accepted",
        ("gateway", "speculation", "accepted_tokens"),
    ),
)
SPEC_DECODE_PATHS = frozenset(path for _, _, path in SPEC_DECODE)


@attrs.frozen
class Figure:
    # Without `_total`: the exporter adds it to counters.
    name: str
    help: str
    value: float
    counter: bool = False


def running(snapshot: JsonObject) -> int:
    return number_at(snapshot, RUNNING)


def waiting(snapshot: JsonObject) -> int:
    """Requests admitted and not yet in the batch: parsing, preparing, queued, or waiting for KV."""
    return max(0, number_at(snapshot, ADMITTED) - running(snapshot))


def kv_usage(snapshot: JsonObject) -> float:
    budget = number_at(snapshot, KV_BUDGET)
    return number_at(snapshot, KV_HELD) / budget if budget > 0 else 0.0


def snapshot_metrics(snapshot: JsonObject) -> list[Figure]:
    figures = [
        Figure("vllm:num_requests_running", "Requests in the batch", running(snapshot)),
        Figure("vllm:num_requests_waiting", "Requests admitted and waiting for a batch row", waiting(snapshot)),
        Figure("vllm:kv_cache_usage_perc", "KV held by running rows over the KV budget (1 = full)", kv_usage(snapshot)),
        Figure(
            "vllm:num_preemptions",
            "Rows moved out of the batch under memory pressure",
            number_at(snapshot, PREEMPTIONS),
            counter=True,
        ),
    ]
    gateway = snapshot.get("gateway")
    if isinstance(gateway, dict) and gateway.get("speculation"):
        figures += [Figure(name, text, number_at(snapshot, path), counter=True) for name, text, path in SPEC_DECODE]
    for path, value in _numbers(snapshot, ()):
        dotted = ".".join(path)
        name = PREFIX + "_".join(_UNSAFE.sub("_", part) for part in path)
        counter = dotted in COUNTERS or path in SPEC_DECODE_PATHS
        figures.append(Figure(name, f"/stats {dotted}", value, counter=counter))
    return figures


def server_metrics(snapshot: JsonObject) -> list[Figure]:
    """Figures of the server rather than of one model (the Responses store), named as `snapshot_metrics` names them."""
    figures = []
    for path, value in _numbers(snapshot, ()):
        dotted = ".".join(path)
        name = PREFIX + "_".join(_UNSAFE.sub("_", part) for part in path)
        figures.append(Figure(name, f"/stats {dotted}", value, counter=dotted in COUNTERS))
    return figures


def _numbers(value: JsonValue, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], float]]:
    if isinstance(value, dict):
        return [pair for key, child in value.items() for pair in _numbers(child, (*path, key))]
    if isinstance(value, bool):
        return [(path, 1.0 if value else 0.0)]
    if isinstance(value, (int, float)) and math.isfinite(value):
        return [(path, float(value))]
    return []


def number_at(snapshot: JsonObject, path: tuple[str, ...]) -> int:
    """The integer at `path`, or 0 where the snapshot has none there."""
    value: JsonValue = snapshot
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
