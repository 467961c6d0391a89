"""A streamed reply as the bytes of an SSE body.

The stream protocol (wire/) turns events into frames; this keeps the
stream alive while the request waits in the queue or in prefill (a
keepalive frame each `interval` without output), persists a finished
Responses turn before its terminal frame, and ends a failed stream with
the protocol's error frame.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio

from pipeline.errors import RequestError
from pipeline.events import CompletionEvent
from pipeline.protocol import StreamProtocol
from stages.messages import Reply

Persist = Callable[[StreamProtocol], Awaitable[None]]


async def sse_body(
    reply: Reply, protocol: StreamProtocol, persist: Persist | None, interval: float
) -> AsyncIterator[bytes]:
    """A streamed reply as SSE bytes: keepalives while nothing comes, a terminal frame whatever happens."""
    with reply:
        yield protocol.start()
        try:
            async for events in _batches(reply, interval):
                yield protocol.keepalive() if events is None else protocol.add_events(events)
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


async def _batches(reply: Reply, interval: float) -> AsyncIterator[list[CompletionEvent] | None]:
    """The reply's event batches, and None each time `interval` passes without one."""
    while True:
        # A reader that is behind finds its events waiting: no timer for those (the per-token path under load).
        if ready := reply.take_ready():
            yield ready
            continue
        batch: list[CompletionEvent] | None = None
        with anyio.move_on_after(interval):
            try:
                batch = await reply.__anext__()
            except StopAsyncIteration:
                return
        # A wait cut short loses nothing: the reply keeps its events until read.
        yield batch
