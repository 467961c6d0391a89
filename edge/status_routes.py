"""Routes that report on the server rather than run the model: health, fit, stats, metrics and loads.

A blueprint `edge/application.py` registers. `/stats` is the one snapshot the others
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
from quart import Blueprint, Response, request

from edge.choice import fleet
from edge.fleet_status import apple_table, fleet_fit, fleet_health, fleet_stats, model_fit
from edge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edge.metrics import Metrics, ModelLoad
from edge.redact import without_paths
from edge.state import app_state
from edge.store import store_call
from fleet.model_host import unavailable
from pipeline.requests import JsonObject, JsonValue
from stages.adapters import not_found
from stages.engine.engine import Engine
from stages.engine.speech import SpeechEngine
from stages.remote.blas_share import BLAS_SHARE
from wire.sse import dumps

routes = Blueprint("status", __name__)


def _engine() -> Engine:
    """The model these reports read: the one model, or the first loaded of several."""
    hosts = fleet().hosts.values()
    loaded = [host.engine for host in hosts if isinstance(host.engine, Engine)]
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
    if isinstance(speech := fleet().default.engine, SpeechEngine):
        return _speech_health(speech)
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
    return {
        "id": engine.info.name,
        "state": worker.state,
        "pid": worker.pid,
        "restarts": worker.restarts,
        # Whether this worker was the spare, started and imported before it was needed (stages/remote/spare.py).
        "spare": worker.spare,
        # Forked by the front's zygote, its imports the front's, rather than spawned (stages/remote/zygote.py).
        "forked": worker.forked,
        "in_process": False,
    }


def _speech_health(engine: SpeechEngine) -> Response:
    """A speech model served alone: ready once its model loaded, on a thread of this process."""
    status = "ok" if engine.ready else ("dead" if engine.dead else "unavailable")
    state: JsonObject = {
        "id": engine.info.name,
        "state": "ready" if engine.ready else "loading",
        "pid": os.getpid(),
        "in_process": True,
    }
    return _json({"status": status, "models": [state]}, status=200 if status == "ok" else 503)


@routes.get("/fit")
async def fit() -> Response:
    """What this machine can serve of this model: memory split, largest safe context, decode bound."""
    if fleet().several:
        model = request.args.get("model")
        return _json(await model_fit(fleet(), model) if model else await fleet_fit(fleet()))
    engine = _engine()
    # Beside the plan, each form of the weights with its plan's window and speed (stages/engine/weight_forms.py).
    body = cast(JsonObject, without_paths({**attrs.asdict(engine.fit), "weights": attrs.asdict(engine.weights)}))
    if (model := request.args.get("model")) is not None:
        if not engine.served.knows(model):
            raise not_found(model, "model", served=(engine.info.name,))
        body["apple_machines"] = await apple_table(engine.info.path)
    return _json(body)


@routes.get("/stats")
async def stats() -> Response:
    if fleet().several:
        store = await store_call(app_state().running.response_store, lambda store: store.statistics())
        report = fleet_stats(fleet())
        blas = app_state().blas
        report.update(
            blas=blas, worker_blas_threads=BLAS_SHARE.describe(), response_store=cast(JsonObject, attrs.asdict(store))
        )
        report.update(_batches())
        return _json(without_paths(report))
    if isinstance(speech := fleet().default.engine, SpeechEngine):
        return _json(without_paths({"model": speech.info.name, **attrs.asdict(speech.statistics())}))
    return _json(await _snapshot())


@routes.get("/metrics")
async def metrics() -> Response:
    if not fleet().several:
        snapshot = await _snapshot()
        return Response(_metrics().render({fleet().default.name: snapshot}), content_type=METRICS_CONTENT_TYPE)
    # Each model's own series; the Responses store is the server's, so it is told once, not under every model.
    snapshots = {name: await _model_snapshot(engine) for name, engine in _loaded().items()}
    shared: JsonObject = {"response_store": await _store_statistics(), **_batches()}
    return Response(_metrics().render(snapshots, shared), content_type=METRICS_CONTENT_TYPE)


@routes.get("/v1/loads")
async def loads() -> Response:
    """SGLang's load report: one entry per loaded model (`?model=NAME`: that model's alone)."""
    several = fleet().several
    if not several:
        engines = {fleet().default.name: _engine()}
    elif model := request.args.get("model"):
        host = fleet().host_named(model)
        engines = {host.name: host.engine} if isinstance(host.engine, Engine) else {}
    else:
        engines = _loaded()
    models = [
        ModelLoad(
            model_name=name,
            snapshot=await _model_snapshot(engine),
            kv_bytes_per_token=engine.fit.memory.kv_bytes_per_token,
            # A model's own batch (its `kv.max_batch` in the models file), else the server's.
            max_batch=fleet().hosts[name].spec.kv.max_batch or app_state().running.settings.max_batch,
        )
        for name, engine in engines.items()
    ]
    return _json(_metrics().loads(models, named=several, now=time.time()))


def _metrics() -> Metrics:
    return app_state().running.metrics


def _loaded() -> dict[str, Engine]:
    """The language models with an engine now, by name, in the order configured (a speech model has no batch)."""
    return {name: host.engine for name, host in fleet().hosts.items() if isinstance(host.engine, Engine)}


async def _store_statistics() -> JsonObject:
    store = await store_call(app_state().running.response_store, lambda store: store.statistics())
    # The store's file is a path like the model's: cut to its name (edge/redact.py).
    return cast(JsonObject, without_paths(attrs.asdict(store)))


async def _snapshot() -> JsonObject:
    """The one model's `/stats`: its figures and the Responses store's."""
    report = await _model_snapshot(_engine())
    report["response_store"] = await _store_statistics()
    report.update(_batches())
    return report


def _batches() -> JsonObject:
    """The batches running beneath live traffic (edge/batch_runner.py), the server's and no one model's."""
    return {"batches": cast(JsonObject, attrs.asdict(app_state().running.batch_runner.statistics()))}


async def _model_snapshot(current: Engine) -> JsonObject:
    snapshot = attrs.asdict(await current.fresh_statistics())
    blas = app_state().blas
    report: JsonObject = {
        "model": current.info.name,
        "blas": blas,
        "weights": current.weights.description,
        **snapshot,
    }
    # The KV cache's scheme as the plan prices it (also in /fit): "full", or "q8g64" with its figures.
    fit = current.fit
    scheme = attrs.asdict(fit.model.kv_scheme)
    report["kv_scheme"] = {"name": fit.kv_scheme, **scheme, "kv_bytes_per_token": fit.memory.kv_bytes_per_token}
    return cast(JsonObject, without_paths(report))
