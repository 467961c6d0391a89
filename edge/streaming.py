"""A streamed reply as the bytes of an SSE body.

The stream protocol (wire/) turns events into frames; this keeps the
stream alive while the request waits in the queue or in prefill (a
keepalive frame when the server's keepalive clock finds it quiet,
edge/keepalive.py), persists a finished
Responses turn before its terminal frame, and ends a failed stream with
the protocol's error frame.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from edge.keepalive import Keepalives
from pipeline.errors import RequestError
from pipeline.protocol import StreamProtocol
from stages.messages import Reply

Persist = Callable[[StreamProtocol], Awaitable[None]]


async def sse_body(
    reply: Reply, protocol: StreamProtocol, persist: Persist | None, keepalives: Keepalives
) -> AsyncIterator[bytes]:
    """A streamed reply as SSE bytes: keepalives while nothing comes, a terminal frame whatever happens."""
    with reply, keepalives.watching(reply):
        yield protocol.start()
        try:
            async for events in reply:
                # An empty batch: the keepalive clock found the stream quiet for an interval.
                yield protocol.add_events(events) if events else protocol.keepalive()
            if reply.closed:
                # The client has gone (edge/disconnect.py): nobody is left to read a tail.
                return
            tail = protocol.finish(reply.summary)
            if persist is not None:
                await persist(protocol)
        except RequestError as error:
            yield protocol.error(error)
            return
        yield tail
