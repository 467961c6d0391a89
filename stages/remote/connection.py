"""What every worker session shares: the frames both ways, the heartbeat watch's clock, the flags a supervisor reads.

A session (stages/remote/session.py for a chat model's rows, stages/remote/speech_session.py for a speech model's
transcriptions) lives from its worker's start to its end. Whatever its kind, it owns the outbox of frames queued for
the worker (the first frame, its settings, at the head), writes them in order, reads the worker's frames until the
worker ends or is lost, keeps when the front last heard from it (`silent_s`, which the supervisor's heartbeat watch
reads) and whether the worker said it is ready, refused its model, or served anything. What a frame means is the
kind's (`_handle`), and so is whether an end is a loss (`_ended_cleanly`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from pipeline.channels import Channel, open_channel
from stages.remote.frames import FrameError, FrameReader, FrameWriter
from stages.remote.process import WorkerProcess

log = structlog.get_logger(stage="remote")
_SEND_FAILED = (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError)


@attrs.define(eq=False, kw_only=True)
class WorkerConnection:
    # The frames a worker of this kind sends (a union of msgspec Structs), and its outbox's name in traces.
    incoming: ClassVar[Any]
    outbox_name: ClassVar[str]

    worker: WorkerProcess
    # Frames the front may have queued for the worker (each kind says what per request in flight).
    _capacity: int = attrs.field(alias="capacity")
    # Told of the worker's ready frame (the supervisor's state, its start's log, the engine's start).
    _on_ready: Callable[[Any], None] = attrs.field(alias="on_ready")
    # Told why the worker is lost (its end, a bad frame, its refusal); the supervisor keeps the first.
    _lose: Callable[[str], None] = attrs.field(alias="lose")
    # Why the worker said it cannot serve its model: the supervisor does not restart it.
    refused: str | None = attrs.field(default=None, init=False)
    # It finished a request: its loss does not count towards the restarts in a row that fail the model.
    served: bool = attrs.field(default=False, init=False)
    ready: bool = attrs.field(default=False, init=False)
    _outbox: Channel[Any] | None = attrs.field(default=None, init=False)
    # The heartbeat watch's clock: the last frame read, and since when a read has waited (None: not reading).
    _last_frame: float = attrs.field(factory=time.monotonic, init=False)
    _reading_since: float | None = attrs.field(default=None, init=False)

    def silent_s(self) -> float:
        """How long the worker has kept the front waiting on its next frame (0 while the front is not waiting)."""
        since = self._reading_since
        return time.monotonic() - max(since, self._last_frame) if since is not None else 0.0

    async def run(self, first: Any) -> None:
        """Send `first`, then serve frames until the worker ends or is lost; what is queued for it dies with it."""
        self._outbox = open_channel(self._capacity, name=self.outbox_name)
        try:
            self._outbox.send.send_nowait(first)
            self._last_frame = time.monotonic()
            async with anyio.create_task_group() as group:
                group.start_soon(self._write, self._outbox.receive)
                await self._read(group)
                group.cancel_scope.cancel()
        finally:
            # What it held was failed by the loss, or finished before its end.
            self._outbox.send.close()
            self._outbox.receive.close()
            self._outbox = None

    def send(self, message: Any) -> bool:
        """Queue `message` for a ready worker; False when it is not ready, gone, or its outbox is full."""
        return self.ready and self._queue(message)

    def _queue(self, message: Any) -> bool:
        """Queue `message` whether or not the worker is ready yet (an abort of a row already sent)."""
        if self._outbox is None:
            return False
        try:
            self._outbox.send.send_nowait(message)
        except _SEND_FAILED:
            return False
        return True

    def _ended_cleanly(self, error: BaseException) -> bool:
        """Whether the worker's end, seen as `error` by the read, is the end the front asked for rather than a loss."""
        return False

    async def _handle(self, message: Any, group: TaskGroup) -> bool:
        """Act on one frame from the worker; False when the session ends with it."""
        raise NotImplementedError

    def _refuse(self, reason: str) -> bool:
        """The worker cannot serve its model: said once, and the session ends."""
        self.refused = reason
        log.error("worker.refused", pid=self.worker.pid, reason=reason)
        self._lose(f"the worker (pid {self.worker.pid}) refused to start: {reason}")
        return False

    async def _read(self, group: TaskGroup) -> None:
        reader: FrameReader[Any] = FrameReader(self.worker.stream, self.incoming)
        pid = self.worker.pid
        while True:
            self._reading_since = time.monotonic()
            try:
                message = await reader.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, FrameError, OSError) as error:
                if not self._ended_cleanly(error):
                    self._lose(f"the worker (pid {pid}) exited" if not isinstance(error, FrameError) else str(error))
                return
            finally:
                self._reading_since = None
            self._last_frame = time.monotonic()
            if not await self._handle(message, group):
                return

    async def _write(self, outbox: MemoryObjectReceiveStream[Any]) -> None:
        writer = FrameWriter(self.worker.stream)
        async for message in outbox:
            try:
                await writer.send(message)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the reader sees the worker go
