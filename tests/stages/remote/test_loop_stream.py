"""stages/remote/loop_stream.py: the front's end of a worker's socket, on both backends, over a real Unix socket.

The stream the loop watches throughout must keep anyio's contract where the crossing leans on it: a worker's
writes are held back once the front stops reading, a frame larger than the read buffer crosses whole, and the
ends read as anyio's (`EndOfStream` when the worker goes, `ClosedResourceError` once the front closed it).
"""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import ByteStream

from stages.remote.crossing import JobOut, ToFront
from stages.remote.frames import FrameReader, FrameWriter
from tests.stages.remote.test_remote_crossing import anyio_backend, bytes_written_until_held, pair  # noqa: F401  (fixtures: a connected pair, both backends)


async def test_a_front_that_stops_reading_holds_the_worker_back(pair: tuple[ByteStream, ByteStream]) -> None:
    """Back-pressure towards the worker: the front's stream stops reading past its bound, so the worker blocks."""
    _front, worker = pair
    sent = await bytes_written_until_held(worker)
    assert sent is not None, "the worker was never held back"
    assert sent < 16 * 1024 * 1024


async def test_a_frame_larger_than_the_read_buffer_crosses_whole(pair: tuple[ByteStream, ByteStream]) -> None:
    front, worker = pair
    job = JobOut(job_id=1, vectors=[bytes(range(256)) * 12_288])  # 3 MiB, past the stream's bound
    async with anyio.create_task_group() as group:
        group.start_soon(FrameWriter(worker).send, job)
        assert await FrameReader[ToFront](front, ToFront).receive() == job


async def test_the_ends_read_as_anyio_says(pair: tuple[ByteStream, ByteStream]) -> None:
    front, worker = pair
    await worker.send(b"last")
    await worker.aclose()
    assert await front.receive() == b"last"
    with pytest.raises(anyio.EndOfStream):
        await front.receive()
    await front.aclose()
    with pytest.raises(anyio.ClosedResourceError):
        await front.receive()
    with pytest.raises(anyio.ClosedResourceError):
        await front.send(b"x")
