"""One configured model and its state: unloaded, loading, ready, unloading or failed.

A host owns at most one `Engine` at a time, run in a cancel scope of its
own inside the fleet's task group, so unloading one model (or its engine
failing) never touches another. The fleet changes states; the host keeps
them with what `/v1/models`, `/health` and `/stats` report.
"""

from __future__ import annotations

import enum
import time
from typing import Any

import anyio
import attrs
from anyio.abc import TaskStatus

from fleet.footprint import Footprint
from fleet.policy import Resident
from fleet.spec import Defaults, ModelSpec
from pipeline.errors import ErrorKind, RequestError, first_error, reason_of
from pipeline.requests import JsonObject
from stages.engine.engine import Engine, EngineStart
from stages.engine.speech import SpeechEngine
from stages.models import load_progress
from stages.remote.process import WorkerRefused


class State(enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    # Draining its requests, or stopping, before its memory is free.
    UNLOADING = "unloading"
    FAILED = "failed"


@attrs.define
class ModelHost:
    spec: ModelSpec
    state: State = State.UNLOADED
    engine: Engine | SpeechEngine | None = None
    # Known once it was first placed; None in the single-model mode, which plans as one model always has.
    footprint: Footprint | None = None
    # The spec's defaults over the model's generation_config.json, composed at each load.
    defaults: Defaults = attrs.field(init=False)
    last_used: float = attrs.field(factory=time.monotonic)
    # Routes between choosing this model and handing it their request (the engine counts it from there).
    leases: int = 0
    # Requests waiting for it to load.
    waiting: int = 0
    error: str | None = None
    # What the last load or run raised, for a start that must fail with it.
    failure: Exception | None = None
    loads: int = 0
    unloads: int = 0
    # time.monotonic() when the last load began; its phase is stages/models/load_progress.py's.
    loading_since: float = 0.0
    # Set when a load settles (ready or failed), and when the engine's task has ended.
    started: anyio.Event = attrs.field(factory=anyio.Event)
    stopped: anyio.Event = attrs.field(factory=anyio.Event)
    scope: anyio.CancelScope | None = None

    def __attrs_post_init__(self) -> None:
        self.defaults = self.spec.defaults

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def busy(self) -> bool:
        if self.leases or self.state in (State.LOADING, State.UNLOADING):
            return True
        return self.engine is not None and self.engine.statistics().admission.in_flight > 0

    @property
    def holds_memory(self) -> bool:
        return self.state in (State.LOADING, State.READY, State.UNLOADING)

    def resident(self) -> Resident:
        return Resident(
            name=self.name,
            bytes=self.footprint.bytes if self.footprint else 0,
            pinned=self.spec.pinned,
            busy=self.busy,
            last_used=self.last_used,
        )

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def ttl_left(self, ttl: float) -> float:
        """Seconds before an idle unload under `ttl`, counted from the last use as fleet/policy.py's `expired`
        counts them (a busy model is never unloaded)."""
        return max(0.0, ttl - (time.monotonic() - self.last_used))

    def starting(self) -> None:
        self.state, self.error = State.LOADING, None
        self.started, self.stopped = anyio.Event(), anyio.Event()
        self.loads += 1
        self.loading_since = time.monotonic()
        load_progress.forget(self.name)

    async def serve(self, start: EngineStart | SpeechEngine) -> None:
        """Run `start`'s engine until it stops or the fleet cancels it; never raises (a failure is this model's
        state)."""
        started = _Started(self)
        try:
            with anyio.CancelScope() as self.scope:
                await start.run(task_status=started)
            if started.engine is not None and started.engine.dead and self.state is not State.UNLOADING:
                self.error = "the engine stopped; see the server log"
        except Exception as error:  # noqa: BLE001 - a model that cannot load or crashes fails alone
            # A worker's refusal is already its reason, named by its own type.
            first = first_error(error)
            self.error, self.failure = str(first) if isinstance(first, WorkerRefused) else reason_of(error), error
        finally:
            # An engine that started and died is kept: it answers its requests with 503 `engine_dead`, and
            # /health reports it, until the fleet replaces it.
            if not (self.error and started.engine is not None and self.engine is started.engine):
                self.engine = None
            self.scope = None
            load_progress.forget(self.name)
            self.state = State.FAILED if self.error else State.UNLOADED
            self.started.set()
            self.stopped.set()

    @property
    def refused(self) -> bool:
        """The last load failed because the model's worker refused its settings (`WorkerRefused`)."""
        failure = self.failure
        return self.state is State.FAILED and failure is not None and isinstance(first_error(failure), WorkerRefused)

    def report(self) -> JsonObject:
        report: JsonObject = {"state": self.state.value, "pinned": self.spec.pinned, "ttl": self.spec.ttl}
        if self.error:
            report["error"] = self.error
        if (progress := self.progress()) is not None:
            report["loading"] = progress
        return report

    def progress(self) -> JsonObject | None:
        """While it loads, how far: `phase` (stages/models/load_progress.py's), `phase_s`, `elapsed_s` and, once
        known, `weights_bytes`; None in any other state."""
        if self.state is not State.LOADING:
            return None
        phase = load_progress.current(self.name) or load_progress.LoadPhase(load_progress.STARTING, self.loading_since)
        return dict(phase.report(loading_since=self.loading_since))


@attrs.define
class _Started(TaskStatus[Any]):
    _host: ModelHost
    # The engine this run reported ready, if it did.
    engine: Engine | SpeechEngine | None = None

    def started(self, value: Engine | SpeechEngine | None = None) -> None:
        self.engine = self._host.engine = value
        self._host.started.set()


def cannot_place(name: str, reason: str, retry_after: float) -> RequestError:
    return RequestError(
        kind=ErrorKind.UNAVAILABLE,
        message=f"The model `{name}` cannot be loaded now: {reason}",
        code="model_not_loaded",
        retry_after=retry_after,
    )


def load_failed(host: ModelHost, retry_after: float) -> RequestError:
    return RequestError(
        kind=ErrorKind.UNAVAILABLE,
        message=f"The model `{host.name}` failed to load: {host.error}",
        code="model_load_failed",
        retry_after=retry_after,
    )


def unavailable(host: ModelHost, retry_after: float) -> RequestError:
    return RequestError(
        kind=ErrorKind.UNAVAILABLE,
        message=f"The model `{host.name}` is {host.state.value}; retry after the suggested delay",
        code="model_unavailable",
        retry_after=retry_after,
    )
