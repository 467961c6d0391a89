"""Health, fit and stats with several models (fleet/): each model's state, footprint and figures.

`/health` is 200 while the fleet serves (a model that is unloaded or
failed is reported, not fatal: it loads, or reloads, on its next use) and
503 once it drains. `/fit?model=NAME` is that model's plan when loaded,
and its footprint (what it would take of the budget) either way, with
the common Apple machines' table (`apple_machines`, stages/models/sku_table.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import anyio
import attrs

from edge.redact import without_paths
from fleet.fleet import Fleet
from fleet.model_host import ModelHost
from pipeline.requests import JsonObject, JsonValue
from pipeline.settings import Settings
from stages.adapters import not_found
from stages.engine.engine import Engine
from stages.engine.speech import SpeechEngine
from stages.models.loading import resolve_model
from stages.models.sku import planning_of
from stages.models.sku_table import apple_machines


def fleet_health(fleet: Fleet) -> tuple[JsonObject, bool]:
    models: JsonObject = {}
    for name, host in fleet.hosts.items():
        report = host.report()
        if host.engine is not None:
            report["ready"] = host.engine.ready
            if (worker := host.engine.worker()) is not None:
                report.update(pid=worker.pid, restarts=worker.restarts, spare=worker.spare, forked=worker.forked)
        models[name] = report
    ok = not fleet.draining
    return {"status": "ok" if ok else "unavailable", "models": models}, ok


async def fleet_fit(fleet: Fleet) -> JsonObject:
    return {
        "budget_bytes": fleet.budget,
        "resident_bytes": fleet.resident_bytes(),
        "machine": cast(JsonObject, attrs.asdict(fleet.machine)) if fleet.machine else None,
        "models": {name: _footprint(host) for name, host in fleet.hosts.items()},
    }


async def model_fit(fleet: Fleet, model: str) -> JsonObject:
    """One model's fit.

    Raises:
        RequestError: 404 `model_not_found` for a name no model owns.
    """
    owner = fleet.known_names().get(model)
    if owner is None:
        raise not_found(model, "model", served=tuple(fleet.known_names()))
    host = fleet.hosts[owner]
    await fleet.footprint_of(host)
    body: JsonObject = {"model": host.name, "budget_bytes": fleet.budget, **_footprint(host)}
    if isinstance(host.engine, Engine):
        body.update(cast(JsonObject, without_paths(attrs.asdict(host.engine.fit))))
        body["weights"] = cast(JsonObject, attrs.asdict(host.engine.weights))
    if not isinstance(host.engine, SpeechEngine):
        body["apple_machines"] = await apple_table(await anyio.to_thread.run_sync(_model_path, host))
    return body


async def apple_table(path: Path) -> JsonValue:
    """`/fit?model=`'s rows, one per common Apple machine, for the model in `path` (None for a speech model)."""
    return cast(JsonValue, await anyio.to_thread.run_sync(apple_machines, path, planning_of(Settings.from_env())))


def _model_path(host: ModelHost) -> Path:
    if isinstance(host.engine, Engine):
        return host.engine.info.path
    # Unloaded: found as its load would find it (cached by then: its footprint was just read).
    return resolve_model(host.spec.source, demo=Settings.from_env().demo_model, name=host.name).path


def fleet_stats(fleet: Fleet) -> JsonObject:
    models: JsonObject = {}
    for name, host in fleet.hosts.items():
        report = cast(
            JsonObject,
            {
                **host.report(),
                **_footprint(host),
                "loads": host.loads,
                "unloads": host.unloads,
                "waiting": host.waiting,
            },
        )
        if host.engine is not None:
            report["engine"] = cast(JsonObject, attrs.asdict(host.engine.statistics()))
        models[name] = report
    return {"budget_bytes": fleet.budget, "resident_bytes": fleet.resident_bytes(), "models": models}


def _footprint(host: ModelHost) -> JsonObject:
    report = host.report()
    if host.footprint is not None:
        report["footprint"] = cast(JsonObject, attrs.asdict(host.footprint))
    return report
