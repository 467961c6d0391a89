"""Routes that report on the server rather than run the model: health, fit, stats, metrics and loads.

A blueprint `app.py` registers. `/stats` is the one snapshot the others
are read from: `/metrics` renders it under vLLM's names and ours, and
`/v1/loads` as SGLang's load report, which smg polls. With several models
(fleet/), `/health`, `/fit` and `/stats` report each model
(`edge/fleet_status.py`); `/metrics` and `/v1/loads` the first model
that is loaded.
"""

from __future__ import annotations

import os
import time
from typing import cast

import attrs
from quart import Blueprint, Response, current_app, request

from edge.choice import fleet
from edge.fleet_status import fleet_fit, fleet_health, fleet_stats, model_fit
from edge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edge.metrics import Metrics
from edge.redact import without_paths
from edge.store import store_call
from fleet.host import unavailable
from pipeline.requests import JsonObject, JsonValue
from stages.engine.engine import Engine
from wire.sse import dumps

routes = Blueprint("status", __name__)


def _engine() -> Engine:
    """The model these reports read: the one model, or the first loaded of several."""
    hosts = fleet().hosts.values()
    loaded = [host.engine for host in hosts if host.engine is not None]
    if not loaded:
        raise unavailable(fleet().default, 1.0)
    return loaded[0]


def _json(body: JsonValue, status: int = 200) -> Response:
    return Response(dumps(body), status=status, content_type="application/json")


@routes.get("/health")
async def health() -> Response:
    if fleet().several:
        body, ok = fleet_health(fleet())
        return _json(body, status=200 if ok else 503)
    current = _engine()
    status = "ok" if current.ready else ("dead" if current.dead else "unavailable")
    body = {"status": status, "models": [model_state(current)]}
    if (ranks := current.ranks()) is not None:
        # Sharded over several processes: each rank's heartbeat (stages/shard/liveness.py).
        body["ranks"] = [cast(JsonObject, attrs.asdict(rank)) for rank in ranks]
    return _json(body, status=200 if status == "ok" else 503)


def model_state(engine: Engine) -> JsonObject:
    """The model's state (loading, ready, restarting, failed) and the process that runs it."""
    worker = engine.worker()
    if worker is None:
        state = "ready" if engine.ready else ("failed" if engine.dead else "loading")
        return {"id": engine.info.name, "state": state, "pid": os.getpid(), "in_process": True}
    return {"id": engine.info.name, "state": worker.state, "pid": worker.pid, "restarts": worker.restarts,
            "in_process": False}


@routes.get("/fit")
async def fit() -> Response:
    """What this machine can serve of this model: memory split, largest safe context, decode bound."""
    if fleet().several:
        model = request.args.get("model")
        return _json(await model_fit(fleet(), model) if model else await fleet_fit(fleet()))
    return _json(without_paths(attrs.asdict(_engine().fit)))


@routes.get("/stats")
async def stats() -> Response:
    if fleet().several:
        store = await store_call(current_app, lambda store: store.statistics())
        report = fleet_stats(fleet())
        blas = cast(str, current_app.extensions["blas"])
        report.update(blas=blas, response_store=cast(JsonObject, attrs.asdict(store)))
        return _json(without_paths(report))
    return _json(await _snapshot())


@routes.get("/metrics")
async def metrics() -> Response:
    return Response(_metrics().render(await _snapshot()), content_type=METRICS_CONTENT_TYPE)


@routes.get("/v1/loads")
async def loads() -> Response:
    per_token, max_batch = _engine().fit.memory.kv_bytes_per_token, cast(int, current_app.extensions["max_batch"])
    return _json(_metrics().loads(await _snapshot(), kv_bytes_per_token=per_token, max_batch=max_batch, now=time.time()))


def _metrics() -> Metrics:
    return cast(Metrics, current_app.extensions["metrics"])


async def _snapshot() -> JsonObject:
    current = _engine()
    snapshot = attrs.asdict(await current.fresh_statistics())
    store = await store_call(current_app, lambda store: store.statistics())
    blas = cast(str, current_app.extensions["blas"])
    report: JsonObject = {
        "model": current.info.name,
        "blas": blas,
        "weights": current.weights.description,
        **snapshot,
        "response_store": attrs.asdict(store),
    }
    # The KV cache's scheme as the plan prices it (also in /fit): "full", or "q8g64" with its figures.
    fit = current.fit
    scheme = attrs.asdict(fit.model.kv_scheme)
    report["kv_scheme"] = {"name": fit.kv_scheme, **scheme, "kv_bytes_per_token": fit.memory.kv_bytes_per_token}
    return cast(JsonObject, without_paths(report))
