"""A streamed reply written out: SSE bytes for HTTP, the Responses WebSocket's events for a socket.

The stream protocol (wire/) turns events into frames; `stream_frames` is the one loop that writes them,
whatever their type (pipeline/protocol.py's `Framing`). It keeps the stream alive while the request waits
in the queue or in prefill (a keepalive frame when the server's keepalive clock finds it quiet,
edge/keepalive.py), persists a finished Responses turn before its terminal frame, and ends a failed stream
with the protocol's error frame. `sse_body` is that loop over a protocol's SSE bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import TypeVar

from edge.keepalive import Keepalives
from pipeline.errors import RequestError
from pipeline.protocol import Framing, StreamProtocol
from stages.messages import Reply

F = TypeVar("F")
Persist = Callable[[StreamProtocol], Awaitable[None]]


def sse_body(
    reply: Reply, protocol: StreamProtocol, persist: Persist | None, keepalives: Keepalives
) -> AsyncIterator[bytes]:
    """A streamed reply as SSE bytes: keepalives while nothing comes, a terminal frame whatever happens."""
    return stream_frames(reply, protocol, partial(persist, protocol) if persist else None, keepalives)


async def stream_frames(
    reply: Reply, framing: Framing[F], persist: Callable[[], Awaitable[None]] | None, keepalives: Keepalives
) -> AsyncIterator[F]:
    """`reply`'s frames as `framing` makes them; `persist` runs after the finish is made, before it is sent."""
    with reply, keepalives.watching(reply):
        yield framing.start()
        try:
            async for events in reply:
                # An empty batch: the keepalive clock found the stream quiet for an interval.
                yield framing.add_events(events) if events else framing.keepalive()
            if reply.closed:
                # The client has gone (edge/disconnect.py): nobody is left to read a tail.
                return
            tail = framing.finish(reply.summary)
            if persist is not None:
                await persist()
        except RequestError as error:
            yield framing.error(error)
            return
        yield tail
