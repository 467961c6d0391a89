"""workers/frames_out.py: frames from the worker's loop and its model thread at once, read whole by the front's reader.

Over a real Unix socket, with more bytes than its buffer holds, so the thread's writes wait on a full socket
and the loop's wait on the thread's frame: every frame still arrives whole and each side's in its order.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from anyio.abc import ByteStream

from stages.remote.crossing import JobOut, ReadyOut, ToFront
from stages.remote.frames import FrameReader
from tests.stages.remote.test_remote_crossing import anyio_backend, pair  # noqa: F401  (fixtures: a connected socket pair, both backends)
from workers.frames_out import FramesOut

# Each side's frames; the thread's carry 8,000 floats (about 70 KB), past a Unix socket's buffer together.
FRAMES = 60
SCORES = 8000


async def test_frames_from_the_loop_and_the_thread_arrive_whole_and_in_order(
    pair: tuple[ByteStream, ByteStream],
) -> None:
    front, worker = pair
    frames = FramesOut(worker)
    reader: FrameReader[ToFront] = FrameReader(front, ToFront)
    received: list[ToFront] = []

    async def read() -> None:
        for _ in range(2 * FRAMES):
            received.append(await reader.receive())

    def from_thread() -> None:
        for job in range(FRAMES):
            frames.send_from_thread(JobOut(job_id=job, scores=[float(job)] * SCORES))

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        group.start_soon(anyio.to_thread.run_sync, from_thread)
        for pid in range(FRAMES):
            await frames.send(ReadyOut(pid=pid))
    jobs = [message for message in received if isinstance(message, JobOut)]
    assert [job.job_id for job in jobs] == list(range(FRAMES))
    assert all(job.scores == [float(job.job_id)] * SCORES for job in jobs)
    assert [message.pid for message in received if isinstance(message, ReadyOut)] == list(range(FRAMES))
    assert not frames.front_gone
