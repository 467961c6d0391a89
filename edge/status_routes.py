"""Routes that report on the server rather than run the model: health, fit, stats, metrics and loads.

A blueprint `app.py` registers. `/stats` is the one snapshot the others
are read from: `/metrics` renders it under vLLM's names and ours, and
`/v1/loads` as SGLang's load report, which smg polls.
"""

from __future__ import annotations

import time
from typing import cast

import attrs
from quart import Blueprint, Response, current_app

from edge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edge.metrics import Metrics
from edge.redact import without_paths
from edge.store import store_call
from pipeline.requests import JsonObject, JsonValue
from stages.engine import Engine
from wire.sse import dumps

routes = Blueprint("status", __name__)


def _engine() -> Engine:
    return cast(Engine, current_app.extensions["engine"])


def _json(body: JsonValue, status: int = 200) -> Response:
    return Response(dumps(body), status=status, content_type="application/json")


@routes.get("/health")
async def health() -> Response:
    current = _engine()
    status = "ok" if current.ready else ("dead" if current.dead else "unavailable")
    body: JsonObject = {"status": status}
    if (ranks := current.ranks()) is not None:
        # Sharded over several processes: each rank's heartbeat (stages/shard/liveness.py).
        body["ranks"] = [cast(JsonObject, attrs.asdict(rank)) for rank in ranks]
    return _json(body, status=200 if status == "ok" else 503)


@routes.get("/fit")
async def fit() -> Response:
    """What this machine can serve of this model: memory split, largest safe context, decode bound."""
    return _json(without_paths(attrs.asdict(_engine().fit)))


@routes.get("/stats")
async def stats() -> Response:
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
    snapshot = attrs.asdict(current.statistics())
    store = await store_call(current_app, lambda store: store.statistics())
    report: JsonObject = {"model": current.info.name, "blas": cast(str, current_app.extensions["blas"]), **snapshot, "response_store": attrs.asdict(store)}
    # The KV cache's scheme as the plan prices it (also in /fit): "full", or "q8g64" with its figures.
    fit = current.fit
    report["kv_scheme"] = {"name": fit.kv_scheme, **attrs.asdict(fit.model.kv_scheme), "kv_bytes_per_token": fit.memory.kv_bytes_per_token}
    return cast(JsonObject, without_paths(report))
