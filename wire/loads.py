"""`GET /v1/loads`: the load report SGLang serves and smg polls, from our own figures.

smg's load monitor polls `/v1/loads` on a backend it does not recognise
as vLLM, every `--load-monitor-interval` seconds, and reads one entry per
data-parallel rank (we have one). The field names and meanings are
SGLang's (`LoadSnapshot`); ours map onto them:

- `num_running_reqs`: rows in the batch; `num_waiting_reqs`: admitted and
  not yet running (`wire/metric_figures.py`, the same figures as the vLLM gauges).
- `num_used_tokens` / `max_total_num_tokens`: the KV the running rows hold
  and the KV budget, in tokens of this model's KV; `token_usage` is their
  ratio. `num_total_tokens` adds the waiting rows' prompts, which we do
  not count before admission, so it equals `num_used_tokens`.
- `gen_throughput`: generated tokens per second since the previous poll.
- `cache_hit_rate`: prompt tokens served from the prefix cache over all
  prompt tokens, since start.
- `utilization`: running rows over the batch's rows.

With several models (fleet/) each loaded model is one entry of `loads`,
named by a `model` field beside SGLang's own (smg reads the fields it
knows and defaults the rest), and the aggregate sums them; `?model=NAME`
asks for one model's entry alone.

`num_waiting_uncached_tokens` is left out: the waiting rows' prefix-cache
matches are not known before admission, and a constant 0 would tell smg's
prefill-budget admission there is no queued prefill. smg reads a missing
field as "not reported" (its load snapshot defaults every field).

Pure; the caller supplies the figures and the clock.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import attrs

from pipeline.requests import JsonObject, JsonValue
from wire.metric_figures import KV_BUDGET, KV_HELD, kv_usage, number_at, running, waiting


@attrs.frozen(kw_only=True)
class LoadInputs:
    snapshot: JsonObject
    kv_bytes_per_token: int
    max_running_requests: int
    gen_throughput: float
    cache_hit_rate: float
    # The model this entry reports; None with one model, whose entry stays SGLang's shape exactly.
    model: str | None = None


def loads_body(entries: Sequence[LoadInputs], *, version: str, now: float) -> JsonObject:
    """One `loads` entry per model (`dp_rank` is its place in the list) and their aggregate."""
    loads = [_load(rank, inputs) for rank, inputs in enumerate(entries)]

    def total(field: str) -> int:
        return sum(number_at(load, (field,)) for load in loads)

    def mean(field: str) -> float:
        values = [value for load in loads if isinstance(value := load[field], (int, float))]
        return round(sum(values) / len(values), 4) if values else 0.0

    return {
        "timestamp": datetime.datetime.fromtimestamp(now, tz=datetime.UTC).isoformat(),
        "version": version,
        "dp_rank_count": len(loads),
        "loads": list[JsonValue](loads),
        "aggregate": {
            "total_running_reqs": total("num_running_reqs"),
            "total_waiting_reqs": total("num_waiting_reqs"),
            "total_reqs": total("num_total_reqs"),
            "avg_token_usage": mean("token_usage"),
            "avg_throughput": mean("gen_throughput"),
            "avg_utilization": mean("utilization"),
        },
    }


def _load(rank: int, inputs: LoadInputs) -> JsonObject:
    per_token = max(1, inputs.kv_bytes_per_token)
    used = number_at(inputs.snapshot, KV_HELD) // per_token
    capacity = number_at(inputs.snapshot, KV_BUDGET) // per_token
    run, wait = running(inputs.snapshot), waiting(inputs.snapshot)
    usage = round(kv_usage(inputs.snapshot), 4)
    utilization = round(run / inputs.max_running_requests, 4) if inputs.max_running_requests else 0.0
    throughput = round(inputs.gen_throughput, 2)
    load: JsonObject = {
        "dp_rank": rank,
        "num_running_reqs": run,
        "num_waiting_reqs": wait,
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
    if inputs.model is not None:
        load["model"] = inputs.model
    return load
