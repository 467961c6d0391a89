"""The fleet: every configured model, each loaded on first use, and the routes' way to one.

`Fleet.run` starts the pinned models (the single model of today's settings
is pinned, so it loads at start as it always has) and a watch that unloads
models idle past their `ttl`. `use(model)` is how a route gets an engine:
it resolves the name (404 `model_not_found` for one no model owns), loads
the model if it is not resident (requests queue meanwhile, up to
`max_pending` each; past that, and when memory cannot be made, a 503 with
Retry-After), and holds a lease until the route has handed over its
request (from then on the engine's own in-flight count keeps the model
busy). Loads and evictions happen one at a time, under one lock.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup, TaskStatus

from fleet.defaults import generation_config
from fleet.footprint import Footprint, fleet_budget, read_footprint, speech_footprint
from fleet.model_host import ModelHost, State, cannot_place, load_failed, unavailable
from fleet.policy import Refuse, expired, place
from fleet.spec import ModelSpec, served_name
from pipeline.errors import ErrorKind, RequestError, shutting_down
from pipeline.observe import NullObserver, RequestObserver
from pipeline.settings import Settings
from pipeline.yielding import yielding_gil
from stages.adapters import not_found
from stages.engine.engine import Engine, EngineStart
from stages.engine.speech import SpeechEngine
from stages.kv.machine import Machine, read_machine
from stages.models.loading import release_unloaded, resolve_model
from stages.models.whisper import speech_info_for
from stages.remote.blas_share import BLAS_SHARE
from stages.remote.spare import SPARES

log = structlog.get_logger(stage="fleet")

# How often idle models are checked against their ttl, at most.
_TTL_TICK = 1.0


@attrs.define
class Fleet:
    _settings: Settings = attrs.field(alias="settings")
    specs: tuple[ModelSpec, ...] = attrs.field(alias="specs")
    # Several models from a file or list; False: today's one model, planned and named as before.
    several: bool = attrs.field(alias="several")
    # Each model's engine tells its own observer (the metrics label each series with the model).
    _observer_for: Callable[[str], RequestObserver] = attrs.field(
        default=lambda _: NullObserver(), alias="observer_for"
    )
    hosts: dict[str, ModelHost] = attrs.field(init=False)
    # Every name a client may ask by (model, alias, adapter, embedding model) to its model's name.
    _names: dict[str, str] = attrs.field(init=False)
    _group: TaskGroup = attrs.field(init=False)
    _placing: anyio.Lock = attrs.field(factory=anyio.Lock, init=False)
    machine: Machine | None = attrs.field(default=None, init=False)
    budget: int = attrs.field(default=0, init=False)
    draining: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self.hosts = {spec.name: ModelHost(spec) for spec in self.specs}
        self._names = {}
        for spec in self.specs:
            adapters = [item.partition("=")[0].strip() for item in (spec.adapters or "").split(",") if item.strip()]
            embedder = [served_name(spec.embedding_model)] if spec.embedding_model else []
            for asked in (spec.name, *spec.aliases, *adapters, *embedder):
                self._names.setdefault(asked, spec.name)

    @property
    def default(self) -> ModelHost:
        return self.hosts[self.specs[0].name]

    async def run(self, *, task_status: TaskStatus[Fleet] = anyio.TASK_STATUS_IGNORED) -> None:
        if self.several:
            # Each model's load may take the spare worker (stages/remote/spare.py).
            SPARES.several = True
            # Their workers share the cores: each gets its share of BLAS threads (stages/remote/blas_share.py).
            BLAS_SHARE.models = len(self.specs)
            self.machine = await anyio.to_thread.run_sync(read_machine)
            self.budget = fleet_budget(self._settings, self.machine)
            log.info(
                "fleet.starting",
                models=[spec.name for spec in self.specs],
                budget=self.budget,
                worker_blas_threads=BLAS_SHARE.describe(),
            )
        async with anyio.create_task_group() as self._group:
            for host in self.hosts.values():
                if host.spec.pinned:
                    async with self._placing:
                        await self._load(host)
                    # The one model that cannot load fails the start, as it always has; of several, a pinned
                    # model that cannot load fails alone (reported failed, with why) and the others serve.
                    if host.state is not State.READY and not self.several:
                        raise host.failure or RuntimeError(f"model {host.name!r} failed to load: {host.error}")
            if self.several and any(spec.ttl for spec in self.specs):
                self._group.start_soon(self._expire_idle)
            task_status.started(self)
            await anyio.sleep_forever()

    def host_named(self, model: str | None) -> ModelHost:
        """The model a request names (none: the first configured).

        Raises:
            RequestError: 404 `model_not_found` for a name no model owns (with several models).
        """
        if not self.several or not model:
            return self.default
        owner = self._names.get(model)
        if owner is None:
            raise not_found(model, "model", served=tuple(self._names))
        return self.hosts[owner]

    def known_names(self) -> dict[str, str]:
        return dict(self._names)

    @asynccontextmanager
    async def use(self, model: str | None) -> AsyncIterator[Engine | SpeechEngine]:
        """The engine of the model `model` names, loaded if need be, held until the block ends.

        Raises:
            RequestError: 404 for an unknown name; 503 (Retry-After) when it cannot be loaded now.
        """
        host = self.host_named(model)
        engine = await self._ready(host)
        host.leases += 1
        host.touch()
        try:
            yield engine
        finally:
            host.leases -= 1
            host.touch()

    async def _ready(self, host: ModelHost, *, reload_refused: bool = False) -> Engine | SpeechEngine:
        retry = self._settings.retry_after
        if self.draining:
            raise shutting_down()
        if (
            host.engine is not None
            and host.state in (State.READY, State.FAILED)
            and not (self.several and host.engine.dead)
        ):
            # One model alone stays as it always was: a dead engine answers each request with its 503.
            return host.engine
        if host.state is State.UNLOADING:
            raise unavailable(host, retry)
        if host.refused and not reload_refused:
            # Its worker said these settings cannot serve it: every load would end alike, so none is tried.
            raise load_failed(host, retry)
        if host.waiting >= max(1, self._settings.max_pending):
            raise RequestError(
                kind=ErrorKind.UNAVAILABLE,
                message=f"Too many requests are waiting for `{host.name}` to load",
                code="model_loading",
                retry_after=retry,
            )
        host.waiting += 1
        try:
            async with self._placing:
                if host.engine is not None and host.engine.dead:
                    # Replaced on its next use: the restart a dead model gets.
                    await self._unload(host, timeout=0)
                    host.engine = None
                if host.state is not State.READY:
                    await self._load(host)
        finally:
            host.waiting -= 1
        if host.state is State.READY and host.engine is not None:
            return host.engine
        raise load_failed(host, retry)

    async def _load(self, host: ModelHost) -> None:
        """Place `host` (evicting as the policy says) and start its engine; under `_placing`."""
        # Other models may be streaming: the loop keeps its turn beside the load's threads.
        with yielding_gil():
            await self._place_and_start(host)

    async def _place_and_start(self, host: ModelHost) -> None:
        retry = self._settings.retry_after
        settings = self._settings
        if self.several:
            await self.footprint_of(host)
            assert host.footprint is not None
            others = [other.resident() for other in self.hosts.values() if other is not host and other.holds_memory]
            decision = place(host.footprint.bytes, budget=self.budget, resident=others)
            if isinstance(decision, Refuse):
                log.warning("fleet.cannot_place", model=host.name, reason=decision.reason)
                raise cannot_place(host.name, decision.reason, retry)
            for name in decision.evict:
                log.info("fleet.evict", model=name, for_model=host.name)
                await self._unload(self.hosts[name], timeout=settings.drain_timeout)
            settings = engine_settings(settings, host.spec, host.footprint)
        host.starting()
        log.info("fleet.loading", model=host.name)
        start = await self._engine_for(settings, host.name)
        self._group.start_soon(host.serve, start)
        await host.started.wait()
        if host.engine is None:
            log.error("fleet.load_failed", model=host.name, error=host.error)
            return
        shipped = await anyio.to_thread.run_sync(generation_config, host.engine.info.path)
        host.defaults = host.spec.defaults.over(shipped)
        host.state = State.READY
        host.touch()
        log.info("fleet.ready", model=host.name)

    async def _engine_for(self, settings: Settings, name: str) -> EngineStart | SpeechEngine:
        """A speech model's engine (stages/engine/speech.py), else a language model's start (its `Engine` is built
        once its start-up decisions are made)."""
        find = partial(speech_info_for, settings.model, demo=settings.demo_model, name=settings.model_name)
        speech = await anyio.to_thread.run_sync(find)
        if speech is not None:
            return SpeechEngine(settings=settings, info=speech)
        return EngineStart(settings=settings, observer=self._observer_for(name))

    async def footprint_of(self, host: ModelHost) -> Footprint:
        """What `host` takes of the budget (measured once, without loading it)."""
        if host.footprint is None:
            host.footprint = await anyio.to_thread.run_sync(self._measure, host.spec)
        return host.footprint

    def resident_bytes(self) -> int:
        return sum(host.resident().bytes for host in self.hosts.values() if host.holds_memory)

    def _measure(self, spec: ModelSpec) -> Footprint:
        speech = speech_info_for(spec.source, demo=self._settings.demo_model, name=spec.name)
        if speech is not None:
            return speech_footprint(speech.path)
        info = resolve_model(spec.source, demo=self._settings.demo_model, name=spec.name)
        assert self.machine is not None
        return read_footprint(spec, info.path, info.context_window, self.machine, self._settings)

    async def _unload(self, host: ModelHost, *, timeout: float) -> None:
        engine, scope = host.engine, host.scope
        if engine is None or scope is None:
            return
        host.state = State.UNLOADING
        await engine.drain(timeout)
        scope.cancel()
        await host.stopped.wait()
        host.unloads += 1
        # The engine's objects hold each other; the model's arrays go back only once the cycle is collected.
        await anyio.to_thread.run_sync(release_unloaded)
        log.info("fleet.unloaded", model=host.name)

    async def load(self, name: str) -> ModelHost:
        host = self._admin_host(name)
        # An operator's load tries again even a model that refused (its files may have been mended).
        await self._ready(host, reload_refused=True)
        return host

    async def unload(self, name: str, *, graceful: bool) -> ModelHost:
        """Unload now (requests in flight fail) or once they finish (`graceful`: a drain, bounded)."""
        host = self._admin_host(name)
        async with self._placing:
            await self._unload(host, timeout=self._settings.drain_timeout if graceful else 0)
        return host

    def _admin_host(self, name: str) -> ModelHost:
        owner = self._names.get(name) if self.several else (self.default.name if name in self._names else None)
        if owner is None:
            raise not_found(name, "model", served=tuple(self._names))
        return self.hosts[owner]

    def start_draining(self) -> None:
        """New work is refused with 503 from now on, by every model; what is in flight goes on."""
        self.draining = True
        for host in self.hosts.values():
            if host.engine is not None:
                host.engine.start_draining()

    async def drain(self, timeout: float) -> None:
        """Stop every model: refuse new requests, let those in flight finish (all within `timeout`)."""
        self.start_draining()
        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as group:
                for host in self.hosts.values():
                    group.start_soon(partial(self._unload, host, timeout=timeout))

    async def _expire_idle(self) -> None:
        ttls = {spec.name: spec.ttl for spec in self.specs if spec.ttl}
        tick = min(_TTL_TICK, min(ttls.values()) / 4)
        while True:
            await anyio.sleep(tick)
            for host in self.hosts.values():
                if host.busy:
                    host.touch()
            ready = [host.resident() for host in self.hosts.values() if host.state is State.READY]
            for name in expired(ready, ttls, time.monotonic()):
                async with self._placing:
                    host = self.hosts[name]
                    if host.state is State.READY and not host.busy:
                        log.info("fleet.ttl_unload", model=name, ttl=ttls[name])
                        await self._unload(host, timeout=self._settings.drain_timeout)


def engine_settings(settings: Settings, spec: ModelSpec, footprint: Footprint) -> Settings:
    """One model's engine settings: the server's, with the model's own and its share of the budget."""
    kv = spec.kv
    return attrs.evolve(
        settings,
        model=spec.source,
        model_name=spec.name,
        adapters=spec.adapters,
        model_aliases=",".join(f"{alias}={spec.name}" for alias in spec.aliases) or None,
        embedding_model=spec.embedding_model,
        memory_budget=footprint.bytes,
        models_file=None,
        prompt_cache_bytes=settings.prompt_cache_bytes if kv.prompt_cache_bytes is None else kv.prompt_cache_bytes,
        max_batch=kv.max_batch or settings.max_batch,
        kv_bits=settings.kv_bits if kv.kv_bits is None else kv.kv_bits,
        kv_group_size=kv.kv_group_size or settings.kv_group_size,
        quantized_kv_start=settings.quantized_kv_start if kv.quantized_kv_start is None else kv.quantized_kv_start,
        default_adapter=spec.defaults.adapter,
        context_limit=spec.defaults.context_limit,
    )
