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

The server's own cut is seen here too: at its graceful timeout hypercorn
cancels each connection's task, and Quart, cancelled in `asyncio.wait`,
leaves its route's task behind, still streaming rows nobody will read. So
a cut request first says its last words (a stream's terminal error frame
in its API's shape, or a 503 body if nothing was sent yet), then its
client is marked gone, which closes its reply as a disconnect would.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, cast

import anyio
import attrs
from hypercorn.typing import ASGIReceiveCallable, ASGIReceiveEvent, ASGISendCallable, ASGISendEvent, Scope
from quart import Response, request

# Where a request's `Client` rides in its ASGI scope (what `request.scope` is).
_SCOPE_KEY = "mlx_relay.client"

P = ParamSpec("P")

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]


# How long a cut request may take to say its last words to a client that does not read.
_LAST_WORDS_TIMEOUT = 1.0


@attrs.frozen
class LastWords:
    """What a request says when the server cuts it: a whole error reply, or a stream's last frame."""

    status: int
    body: bytes
    content_type: str = "application/json"
    # The stream's terminal error frame, once its response has started (None: not a stream).
    stream_tail: Callable[[], bytes] | None = None


@attrs.define(eq=False)
class Client:
    """One request's client: whether it has gone, what to do when it goes, what to say if the server cuts it."""

    gone: bool = False
    last_words: LastWords | None = None
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
        """A scope cancelled when the client goes; anyio cancels until the scope exits, so nothing swallows it."""
        with anyio.CancelScope() as scope:
            self.on_gone(scope.cancel)
            yield scope


class WatchClients:
    """ASGI middleware: gives each HTTP request a `Client`, marks it gone on `http.disconnect`,
    and makes a request the server cuts say its last words."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        client = Client()
        cast(dict[str, object], scope)[_SCOPE_KEY] = client
        exchange = _Exchange(send)

        async def watched() -> ASGIReceiveEvent:
            message = await receive()
            if message["type"] == "http.disconnect":
                client.leave()
            return message

        try:
            await self._app(scope, watched, exchange.send)
        except anyio.get_cancelled_exc_class():
            await exchange.cut(client)
            raise


@attrs.define
class _Exchange:
    """One request's sends, watched: whether the response started or ended; none pass once it was cut."""

    _send: ASGISendCallable
    started: bool = False
    ended: bool = False

    async def send(self, message: ASGISendEvent) -> None:
        if self.ended:
            # The route's task Quart left behind after a cut: its client has had its last words.
            return
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    async def cut(self, client: Client) -> None:
        words, started, ended = client.last_words, self.started, self.ended
        self.ended = True
        # Closes the reply: the row leaves the batch, and the task Quart left behind stops.
        client.leave()
        if words is None or ended or (started and words.stream_tail is None):
            return
        messages = [_body(words.stream_tail() if started and words.stream_tail else words.body)]
        if not started:
            headers = [
                (b"content-type", words.content_type.encode()),
                (b"content-length", str(len(words.body)).encode()),
            ]
            messages.insert(0, {"type": "http.response.start", "status": words.status, "headers": headers})
        with anyio.move_on_after(_LAST_WORDS_TIMEOUT, shield=True):
            for message in messages:
                await self._send(cast(ASGISendEvent, message))


def _body(data: bytes) -> dict[str, object]:
    return {"type": "http.response.body", "body": data, "more_body": False}


def current_client() -> Client:
    """The client of the request being handled; a fresh one where no middleware ran (a test client)."""
    scope = cast(dict[str, object], request.scope)
    client = scope.get(_SCOPE_KEY)
    if not isinstance(client, Client):
        client = scope[_SCOPE_KEY] = Client()
    return client


def gone_response() -> Response:
    """What a route returns for a client that has gone: nobody reads it; nginx's 499 (client closed request)
    says so in the access log."""
    return Response(b"", status=499)


def ends_with_client(route: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """A route whose waits end when its client goes (the exclusive queue then drops its job unrun)."""

    @functools.wraps(route)
    async def run(*args: P.args, **kwargs: P.kwargs) -> Response:
        with current_client().while_here():
            return await route(*args, **kwargs)
        return gone_response()

    return run
