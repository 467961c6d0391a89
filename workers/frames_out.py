"""Frames from a worker to its front, written by the event loop's tasks and by the model thread alike.

Each step's frame is written by the model thread itself, as soon as the
step is done (`send_from_thread`): no wake-up of the event loop, no hop
through a channel and a task, per step. The loop's own frames (ready,
heartbeats, finished jobs, failed rows) go out from its tasks (`send`).
One lock keeps whole frames apart; the thread holds it only while its
frame is written, and a loop task that finds it taken tries again after a
short sleep rather than block the loop. The thread's write waits while
the socket is full: a front that stops reading holds the model thread
back, the crossing's back-pressure. Each frame is made by
`stages/remote/frames.py`'s `encode_frame`, the one framing both sides read.
"""

from __future__ import annotations

import select
import threading

import anyio
import anyio.from_thread
from anyio.abc import ByteStream, SocketAttribute

from stages.remote.frames import encode_frame, encoder

# A loop task's wait for a frame the thread is writing (a few microseconds unless the socket is full).
_RETRY_S = 0.0005
# How often a thread waiting on a full socket looks for its host's cancellation.
_POLL_S = 0.1


class FramesOut:
    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._socket = stream.extra(SocketAttribute.raw_socket)
        self._lock = threading.Lock()
        # One encoder per side: an encoder's buffer is not shared between threads.
        self._loop_encoder = encoder()
        self._thread_encoder = encoder()
        # The front stopped reading (its socket broke): frames are dropped, the reader ends the worker.
        self.front_gone = False

    @property
    def busy(self) -> bool:
        """A frame is being written now."""
        return self._lock.locked()

    async def send(self, message: object) -> None:
        frame = encode_frame(self._loop_encoder, message)
        while not self._lock.acquire(blocking=False):
            await anyio.sleep(_RETRY_S)
        try:
            if not self.front_gone:
                await self._stream.send(frame)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.front_gone = True
        finally:
            self._lock.release()

    def send_from_thread(self, message: object) -> None:
        """Write one frame from a thread the event loop started (the model thread); waits while the socket is full."""
        frame = memoryview(encode_frame(self._thread_encoder, message))
        with self._lock:
            while frame and not self.front_gone:
                try:
                    frame = frame[self._socket.send(frame) :]
                except BlockingIOError:
                    select.select([], [self._socket], [], _POLL_S)
                    anyio.from_thread.check_cancelled()
                except OSError:
                    self.front_gone = True
