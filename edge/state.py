"""What the routes share, one typed object per app, in place of string-keyed `app.extensions` entries.

`install` puts an `AppState` on the app when it is built; `state_of(app)` reads it, and `app_state()` reads the
one of the request being served. The app knows only its BLAS and its open sockets when it is built; everything
else is made by the lifespan (edge/lifespan.py) from the settings, and is held in one frozen `Serving` record
that the lifespan sets once, whole, before anything can run a request through the app (the batch runner, the
last part it starts, and the clients, which hypercorn lets in only when the lifespan's start-up is over). So a
route reads `app_state().running.fleet` with no `None` to handle, and a read before the start is a bug that
fails loud (`NotStarted`) rather than a default that could hide it: an unset edge policy once read as "no API
key".
"""

from __future__ import annotations

from typing import Protocol

import attrs
from quart import Quart, current_app

from edge.background import BackgroundRuns
from edge.batch_runner import BatchRunner
from edge.edge_policy import EdgePolicy
from edge.keepalive import Keepalives
from edge.metrics import Metrics
from edge.telemetry import Tracing
from fleet.fleet import Fleet
from pipeline.settings import Settings
from store.files import FileStore
from store.response_store import ResponseStore

# The one key of ours in `app.extensions`: the state object itself.
_KEY = "mlx_relay"


class NotStarted(RuntimeError):
    """The app's state was read before the lifespan had started the app."""


class Stoppable(Protocol):
    """An open Responses socket as the state knows it: something the server's stop must end
    (edge/responses_socket.py's `Session`)."""

    def stop(self) -> None: ...


@attrs.frozen(kw_only=True)
class Serving:
    """What the lifespan made, for the routes: set once, before any request runs."""

    settings: Settings
    policy: EdgePolicy
    keepalives: Keepalives
    metrics: Metrics
    # None when no OpenTelemetry exporter is configured (edge/telemetry.py).
    tracing: Tracing | None
    response_store: ResponseStore
    background_runs: BackgroundRuns
    fleet: Fleet
    files: FileStore
    batch_runner: BatchRunner


@attrs.define(kw_only=True, eq=False)
class AppState:
    # The BLAS that `app.py` loaded before mlx (/stats reports it).
    blas: str
    # The open Responses sockets, which the server's stop closes before HTTP drains.
    sockets: set[Stoppable] = attrs.field(factory=set)
    serving: Serving | None = None

    @property
    def running(self) -> Serving:
        """Raises: NotStarted before the lifespan has set `serving`."""
        if self.serving is None:
            raise NotStarted("the app's state was read before the server started")
        return self.serving


def install(app: Quart, *, blas: str) -> AppState:
    state = AppState(blas=blas)
    app.extensions[_KEY] = state
    return state


def state_of(app: Quart) -> AppState:
    state = app.extensions[_KEY]
    assert isinstance(state, AppState)
    return state


def app_state() -> AppState:
    """The state of the app serving the current request (or socket)."""
    return state_of(current_app)
