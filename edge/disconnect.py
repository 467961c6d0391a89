"""A client that has gone: seen at the ASGI seam, acted on by the routes.

Quart answers the server's `http.disconnect` (a closed socket, or an HTTP/2
stream reset) by cancelling the route's task, and asyncio can lose that
cancellation: Python 3.11's `asyncio.wait_for`, which Quart's body read
uses, returns the body it awaited when the body and the cancellation land
in one turn of the loop. That is exactly a request whose socket closes, or
whose stream is reset, right after its last byte, and such a request ran
to its end. So the disconnect is also watched here, where it passes from
the server to Quart, and a route binds to it what must end with the
client: a cancel scope around its waiting (admission, preparation, a
non-streamed result), and its reply's `close`, which frees the admission
ticket and drops the row before the gateway's next step.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, cast

import anyio
import attrs
from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, ASGISendCallable, Scope
from quart import Response, request

# Where a request's `Client` rides in its ASGI scope (what `request.scope` is).
_SCOPE_KEY = "mlx_relay.client"

P = ParamSpec("P")

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


@attrs.define(eq=False)
class Client:
    """One request's client: whether it has gone, and what to do when it goes."""

    gone: bool = False
    _hooks: list[Callable[[], None]] = attrs.field(factory=list)

    def on_gone(self, hook: Callable[[], None]) -> None:
        """Call `hook` (synchronous, so safe where cancellation lands) once the client goes; now if it has."""
        if self.gone:
            hook()
        else:
            self._hooks.append(hook)

    def leave(self) -> None:
        if self.gone:
            return
        self.gone = True
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    @contextmanager
    def while_here(self) -> Iterator[anyio.CancelScope]:
        """A scope cancelled when the client goes; anyio keeps cancelling until the scope exits, so nothing swallows it."""
        with anyio.CancelScope() as scope:
            self.on_gone(scope.cancel)
            yield scope


class WatchClients:
    """ASGI middleware: gives each HTTP request a `Client` and marks it gone on `http.disconnect`."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        client = Client()
        cast(dict[str, object], scope)[_SCOPE_KEY] = client

        async def watched() -> ASGIReceiveEvent:
            message = await receive()
            if message["type"] == "http.disconnect":
                client.leave()
            return message

        await self._app(scope, watched, send)


def current_client() -> Client:
    """The client of the request being handled; a fresh one where no middleware ran (a test client)."""
    scope = cast(dict[str, object], request.scope)
    client = scope.get(_SCOPE_KEY)
    if not isinstance(client, Client):
        client = scope[_SCOPE_KEY] = Client()
    return client


def gone_response() -> Response:
    """What a route returns for a client that has gone: nobody reads it, and nginx's 499 (client closed request) says so in the access log."""
    return Response(b"", status=499)


def ends_with_client(route: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """A route whose waits end when its client goes (the exclusive queue then drops its job unrun)."""

    @functools.wraps(route)
    async def run(*args: P.args, **kwargs: P.kwargs) -> Response:
        with current_client().while_here():
            return await route(*args, **kwargs)
        return gone_response()

    return run
