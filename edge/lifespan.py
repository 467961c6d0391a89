"""The app's lifespan (Quart's `while_serving`): what is started before the first request and stopped after
the last.

It reads the settings from the environment, opens the Responses store, starts the keepalive clock, the
background runs, the fleet of models and the batch runner in one task group (docs/STYLE.md, "One owner for
the tree"), and sets the app's state (edge/state.py) whole before the batch runner, the first thing that can
run a request, starts. At the stop, sockets close and batch lines are cut before the fleet drains.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import anyio
import structlog
from quart import Quart

from edge import guard
from edge.aliases import check_aliases
from edge.background import BackgroundRuns
from edge.batch_runner import open_batches
from edge.keepalive import Keepalives
from edge.metrics import Metrics
from edge.responses_socket import close_all as close_sockets
from edge.server_logs import configure_server_logs
from edge.state import Serving, state_of
from edge.telemetry import Tracing, configure_tracing
from fleet.fleet import Fleet
from fleet.spec import specs_from_settings
from pipeline.loop_library import named_async_library
from pipeline.observe import Observers, RequestObserver
from pipeline.settings import Settings
from stages.engine.engine import Engine
from stages.models.whisper import import_speech, names_speech_model
from stages.remote.zygote import start_zygote, stop_zygote
from store.store_startup import StartupError, open_response_store

log = structlog.get_logger(stage="http")
# The token histograms' top bucket with several models: past any window a model loaded later may have.
_FLEET_WINDOW = 2**20


async def lifespan(app: Quart) -> AsyncGenerator[None, None]:
    # anyio's calls skip sniffio's sniffing from here on (pipeline/loop_library.py).
    with named_async_library():
        state = state_of(app)
        settings = Settings.from_env()
        configure_server_logs(settings.log_level, settings.log_format)
        log.info("server.starting", blas=state.blas, max_batch=settings.max_batch, max_pending=settings.max_pending)
        specs = specs_from_settings(settings)
        if not settings.model_in_process:
            # Before anything starts a thread (stages/remote/zygote.py); speech's imports in the zygote only where a
            # speech model is served (a second's CPU no chat-only fleet needs).
            speech = any(names_speech_model(spec.source, demo=settings.demo_model) for spec in specs)
            start_zygote(settings.worker_fork, preimport=import_speech if speech else None)
        policy = guard.configure(app, settings)
        try:
            store = await anyio.to_thread.run_sync(open_response_store, settings)
        except StartupError as error:
            # Under `hypercorn app:app` the lifespan failure ends in hypercorn's own traceback; this line comes first.
            log.error("server.cannot_start", reason=str(error))
            raise
        keepalives = Keepalives(settings.keepalive_interval)
        metrics = Metrics()
        tracing = configure_tracing()
        several = len(specs) > 1 or settings.models_file is not None
        try:
            async with anyio.create_task_group() as outer:
                outer.start_soon(keepalives.run)
                # Background responses outlive their requests: their runs live here (edge/background.py).
                runs = BackgroundRuns(store, settings.keepalive_interval)
                await outer.start(runs.run)
                fleet = Fleet(
                    settings=settings, specs=specs, several=several, observer_for=_observers(metrics, tracing)
                )
                await outer.start(fleet.run)
                _configure_metrics(metrics, fleet, several=several)
                batches = await open_batches(app, settings, fleet)
                state.serving = Serving(
                    settings=settings,
                    policy=policy,
                    keepalives=keepalives,
                    metrics=metrics,
                    tracing=tracing,
                    response_store=store,
                    background_runs=runs,
                    fleet=fleet,
                    files=batches.files,
                    batch_runner=batches,
                )
                await outer.start(batches.run)
                # Which event loop serves (uvloop under `mlx-relay serve --loop uvloop` or `hypercorn -k uvloop`).
                loop = type(asyncio.get_running_loop()).__module__
                log.info("server.ready", models=list(fleet.hosts), loop=loop)
                yield
                log.info("server.draining")
                close_sockets(app)
                # Lines still running are cut and run again at the next start (edge/batch_runner.py).
                batches.stop()
                await fleet.drain(settings.drain_timeout)
                outer.cancel_scope.cancel()
        finally:
            stop_zygote()
            await anyio.to_thread.run_sync(store.close)
            if tracing is not None:
                # Flushes the spans still batched.
                await anyio.to_thread.run_sync(tracing.shutdown)
        log.info("server.stopped")


def _observers(metrics: Metrics, tracing: Tracing | None) -> Callable[[str], RequestObserver]:
    """Each model's observer: its `/metrics` series, and its spans when tracing is on."""

    def observer(model_name: str) -> RequestObserver:
        measured = metrics.observer(model_name)
        return Observers((measured, tracing)) if tracing is not None else measured

    return observer


def _configure_metrics(metrics: Metrics, fleet: Fleet, *, several: bool) -> None:
    first = fleet.default.engine if isinstance(fleet.default.engine, Engine) else None
    # With several models the token buckets must hold any model's window, loaded now or later.
    window = _FLEET_WINDOW if several else first.info.context_window if first else 2**15
    metrics.configure(model_names=list(fleet.hosts), context_window=window)
    if not several and first is not None:
        check_aliases(first.served)
