"""The front's end of a worker's socket, kept registered with the event loop for reading.

anyio's Unix socket stream (on asyncio) asks the loop to watch the socket for each `receive` and stops watching
once it is readable: per step frame a checkpoint, a `recv` that finds nothing yet, and an `epoll_ctl` each way, 76 µs
of the loop's CPU per frame against 35 µs here; at one stream, a frame per token, it was the largest share of the
front's CPU (docs/benchmarks.md, "The front's CPU per streamed token"). asyncio's own stream transport watches the
socket for as long as it is open and reads what comes, and it stops reading past its buffer's limit, so a front that
stops reading still holds the worker back. On trio anyio's stream is kept as it is.
"""

from __future__ import annotations

import asyncio
import contextlib

import anyio.lowlevel
from anyio.abc import ByteStream, SocketAttribute

# The transport stops reading once twice this waits unread (asyncio's rule): the worker is held back within half a
# megabyte, far above a step's frame, and a job's larger frame still crosses, read in pieces.
_LIMIT = 256 * 1024


async def loop_stream(stream: ByteStream) -> ByteStream:
    """`stream`, an accepted socket's, as a stream whose socket the loop watches throughout (asyncio only)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return stream  # trio's
    sock = stream.extra(SocketAttribute.raw_socket)
    reader, writer = await asyncio.open_unix_connection(sock=sock, limit=_LIMIT)
    return _TransportStream(reader, writer)


class _TransportStream(ByteStream):
    """anyio's byte stream contract over asyncio's reader and writer: `EndOfStream` at the end, `OSError` raised
    by a broken socket, `ClosedResourceError` once closed here."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.ClosedResourceError if self._closed else anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        self._writer.write(item)
        await self._writer.drain()

    async def send_eof(self) -> None:
        self._writer.write_eof()

    async def aclose(self) -> None:
        # Closed at once (the transport lets go of the socket on the loop's next turn): safe in a cancelled task.
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self._writer.close()
        await anyio.lowlevel.checkpoint()
