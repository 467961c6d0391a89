"""`GET /v1/loads`: the load report SGLang serves and smg polls, from our own figures.

smg's load monitor polls `/v1/loads` on a backend it does not recognise
as vLLM, every `--load-monitor-interval` seconds, and reads one entry per
data-parallel rank (we have one). The field names and meanings are
SGLang's (`LoadSnapshot`); ours map onto them:

- `num_running_reqs`: rows in the batch; `num_waiting_reqs`: admitted and
  not yet running (`wire/metrics.py`, the same figures as the vLLM gauges).
- `num_used_tokens` / `max_total_num_tokens`: the KV the running rows hold
  and the KV budget, in tokens of this model's KV; `token_usage` is their
  ratio. `num_total_tokens` adds the waiting rows' prompts, which we do
  not count before admission, so it equals `num_used_tokens`.
- `gen_throughput`: generated tokens per second since the previous poll.
- `cache_hit_rate`: prompt tokens served from the prefix cache over all
  prompt tokens, since start.
- `utilization`: running rows over the batch's rows.

Pure; the caller supplies the figures and the clock.
"""

from __future__ import annotations

import datetime

import attrs

from pipeline.requests import JsonObject
from wire.metrics import kv_usage, running, waiting


@attrs.frozen(kw_only=True)
class LoadInputs:
    snapshot: JsonObject
    kv_bytes_per_token: int
    max_running_requests: int
    gen_throughput: float
    cache_hit_rate: float
    version: str


def loads_body(inputs: LoadInputs, *, now: float) -> JsonObject:
    gateway = inputs.snapshot.get("gateway")
    gateway = gateway if isinstance(gateway, dict) else {}
    per_token = max(1, inputs.kv_bytes_per_token)
    used = _int(gateway.get("kv_held_bytes")) // per_token
    capacity = _int(gateway.get("kv_budget_bytes")) // per_token
    run, wait = running(inputs.snapshot), waiting(inputs.snapshot)
    usage = round(kv_usage(inputs.snapshot), 4)
    utilization = round(run / inputs.max_running_requests, 4) if inputs.max_running_requests else 0.0
    throughput = round(inputs.gen_throughput, 2)
    load: JsonObject = {
        "dp_rank": 0,
        "num_running_reqs": run,
        "num_waiting_reqs": wait,
        "num_waiting_uncached_tokens": 0,
        "num_total_reqs": run + wait,
        "num_used_tokens": used,
        "num_total_tokens": used,
        "max_total_num_tokens": capacity,
        "max_running_requests": inputs.max_running_requests,
        "token_usage": usage,
        "gen_throughput": throughput,
        "cache_hit_rate": round(inputs.cache_hit_rate, 4),
        "utilization": utilization,
    }
    return {
        "timestamp": datetime.datetime.fromtimestamp(now, tz=datetime.UTC).isoformat(),
        "version": inputs.version,
        "dp_rank_count": 1,
        "loads": [load],
        "aggregate": {
            "total_running_reqs": run,
            "total_waiting_reqs": wait,
            "total_reqs": run + wait,
            "avg_token_usage": usage,
            "avg_throughput": throughput,
            "avg_utilization": utilization,
        },
    }


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
