"""The Quart app built: its hooks, its blueprints, its state and its lifespan (docs/STYLE.md, "Thin app").

`app.py` calls `build_app` once, after it has chosen the BLAS and before it freezes the imported heap; it is
a module of its own so that everything it imports comes after that choice, in one import. `start_draining`
is what the console script's signal handler calls (mlx_relay.py).
"""

from __future__ import annotations

from functools import partial

from quart import Quart

from edge import fields, guard
from edge.admin_routes import routes as admin_routes
from edge.audio_routes import routes as audio_routes
from edge.background_routes import routes as background_routes
from edge.batch_routes import routes as batch_routes
from edge.disconnect import WatchClients
from edge.error_responses import install as install_error_handlers
from edge.file_routes import routes as file_routes
from edge.generation_routes import routes as generation_routes
from edge.lifespan import lifespan
from edge.message_batch_routes import routes as message_batch_routes
from edge.model_routes import routes as model_work_routes
from edge.ollama_routes import ollama_routes
from edge.pull_routes import routes as pull_routes
from edge.responses_socket import close_all as close_sockets
from edge.responses_socket import routes as responses_socket_routes
from edge.state import install as install_state
from edge.state import state_of
from edge.status_routes import routes as status_routes
from edge.web import routes as web_routes


def build_app(name: str, *, blas: str) -> Quart:
    """The app `hypercorn app:app` serves; `blas` is the BLAS loaded before mlx, which `/stats` reports."""
    app = Quart(name)
    # Quart's default of 60 s silently cuts any longer stream (docs/STYLE.md, "Thin app").
    app.config["RESPONSE_TIMEOUT"] = None
    install_state(app, blas=blas)
    guard.install(app)
    install_error_handlers(app)
    # Unread request fields named in a header (edge/fields.py).
    fields.install(app)
    # Sees each request's `http.disconnect` on its way to Quart (edge/disconnect.py: why Quart's cancel is not enough).
    app.asgi_app = WatchClients(app.asgi_app)  # type: ignore[method-assign]
    for blueprint in (
        generation_routes,
        # Embeddings, rerank and score, tokenize and detokenize.
        model_work_routes,
        audio_routes,
        status_routes,
        admin_routes,
        responses_socket_routes,
        web_routes,
        pull_routes,
        background_routes,
        # Files and batches (OpenAI's and Anthropic's), run by the lifespan's batch runner.
        file_routes,
        batch_routes,
        message_batch_routes,
        ollama_routes(),
    ):
        app.register_blueprint(blueprint)
    app.while_serving(partial(lifespan, app))
    return app


def start_draining(app: Quart) -> None:
    """Refuse new work with 503 from now on (the server has been told to stop); a no-op before the engine is up."""
    serving = state_of(app).serving
    if serving is not None:
        serving.fleet.start_draining()
    # Sockets end their turns and close first, as HTTP drains after (edge/responses_socket.py).
    close_sockets(app)
