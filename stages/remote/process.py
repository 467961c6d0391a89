"""One model worker process: started, connected over a private Unix socket, and ended.

The front listens on a socket (0600) in a temporary folder of its own
(0700), starts `python -m workers.main --socket PATH` with the front's
environment (so the worker reads the same `MLX_RELAY_*` settings) and
accepts the one connection the worker makes; the folder goes once it has
(the connection outlives the socket's name). The worker's stderr goes
through a pipe the front reads (`stages/remote/stderr_tail.py`), so a
worker that dies before it can say why still does: its last lines are in
the reason. `end()` ends the process: a drained worker is given `grace`
seconds to exit, then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
import attrs
from anyio.abc import ByteStream, Process, SocketListener

from stages.remote.blas_share import BLAS_SHARE
from stages.remote.loop_stream import loop_stream
from stages.remote.stderr_tail import StderrTail
from stages.remote.zygote import ForkedProcess, Zygote, current_zygote

# workers/priority.py's YIELD_FLAG (the front does not import workers/).
_YIELD_FLAG = "--yield-while-loading"
# The repository's root: the worker imports the same sources as the front.
_ROOT = Path(__file__).resolve().parents[2]
# How long an ended worker's stderr may take to reach its end (its pipe closes as the process goes).
_TAIL_WAIT_S = 1.0
# What of a dead worker's stderr a reason quotes (the log line has the whole tail).
_REASON_CHARS = 1000


class WorkerLost(Exception):
    """The worker ended, or stopped answering, before its work was done."""

    def __init__(self, message: str, *, stderr: str = "") -> None:
        super().__init__(message)
        # The end of what the worker printed, when it never connected (the message quotes less of it).
        self.stderr = stderr


class WorkerRefused(Exception):
    """The worker cannot serve its model with these settings; the message is the worker's reason."""


class WorkerDiedStarting(WorkerRefused):
    """The worker's first start ended before it was ready, with no reason of its own (a crash, an import that
    failed): the message quotes its stderr. Its next start would end alike, so it counts as a refusal."""


# A spawned worker, or one the zygote forked.
WorkerRun = Process | ForkedProcess


@attrs.define(eq=False)
class WorkerProcess:
    process: WorkerRun
    stream: ByteStream
    stderr: StderrTail
    # Started ahead of need and taken idle (stages/remote/spare.py).
    spare: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def forked(self) -> bool:
        return isinstance(self.process, ForkedProcess)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    async def end(self, grace: float) -> None:
        """Ends the process: `grace` seconds to exit on its own, then killed. Safe to call twice."""
        with anyio.CancelScope(shield=True):
            await self.stream.aclose()
            await _end(self.process, grace)

    async def printed(self) -> str:
        """The end of what the (ended) worker wrote to stderr, as a reason quotes it."""
        return await _printed(self.stderr)

    async def last_words(self) -> str:
        """The end of the (ended) worker's stderr once its pipe has ended, or after a second: a log line's tail."""
        await anyio.to_thread.run_sync(self.stderr.wait_closed, _TAIL_WAIT_S)
        return self.stderr.text()


async def start_worker(
    *, connect_timeout: float, yield_cpu: bool = False, spawned: Callable[[int], None] | None = None
) -> WorkerProcess:
    """A started, connected worker; the caller ends it (`end`). `yield_cpu`: it starts nicer (workers/priority.py).
    `spawned` hears the process's id before it connects.

    Raises:
        WorkerLost: the worker exited, or did not connect within `connect_timeout`; the message quotes its stderr.
    """
    with tempfile.TemporaryDirectory(prefix="mlx-relay-worker-") as folder:
        path = Path(folder) / "worker.sock"
        async with await anyio.create_unix_listener(path, mode=0o600) as listener:
            argv = ["--socket", str(path), *([_YIELD_FLAG] if yield_cpu else [])]
            read_end, write_end = os.pipe()
            try:
                process = await _launch(argv, write_end)
            except BaseException:
                os.close(read_end)
                raise
            finally:
                # Only the worker writes to it now: its end is the worker's.
                os.close(write_end)
            stderr = StderrTail(read_end)
            if spawned is not None:
                spawned(process.pid)
            try:
                stream = await loop_stream(await _accept(listener, process, connect_timeout, stderr))
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await _end(process, 0.0)
                raise
    return WorkerProcess(process=process, stream=stream, stderr=stderr)


def forks_workers() -> bool:
    """Whether the next worker is forked by the front's zygote (stages/remote/zygote.py) rather than spawned."""
    return _forking_zygote() is not None


def _forking_zygote() -> Zygote | None:
    zygote = current_zygote()
    return zygote if zygote is not None and zygote.serves() else None


async def _launch(argv: list[str], stderr_fd: int) -> WorkerRun:
    """`python -m workers.main *argv`: forked where the zygote serves it, else spawned."""
    thread_counts = BLAS_SHARE.environment()
    if (zygote := _forking_zygote()) is not None:
        with contextlib.suppress(OSError), anyio.CancelScope(shield=True):
            # Shielded: a fork the caller no longer waits for would leave a worker nobody ends.
            pid, status_fd = await anyio.to_thread.run_sync(zygote.fork_worker, argv, stderr_fd, thread_counts)
            return ForkedProcess(pid, status_fd)
    path_entries = filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])
    env = {**os.environ, **thread_counts, "PYTHONPATH": os.pathsep.join(path_entries)}
    return await anyio.open_process(
        [sys.executable, "-m", "workers.main", *argv],
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=stderr_fd,
        env=env,
    )


def exit_status(process: WorkerRun) -> str:
    code = process.returncode
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


async def _printed(stderr: StderrTail) -> str:
    await anyio.to_thread.run_sync(stderr.wait_closed, _TAIL_WAIT_S)
    text = stderr.text(_REASON_CHARS)
    return f"it printed: {text}" if text else "it printed nothing"


async def _accept(listener: SocketListener, process: WorkerRun, timeout: float, stderr: StderrTail) -> ByteStream:
    accepted: list[ByteStream] = []
    async with anyio.create_task_group() as group:

        async def exited() -> None:
            await process.wait()
            group.cancel_scope.cancel()

        async def accept() -> None:
            accepted.append(await listener.accept())
            group.cancel_scope.cancel()

        group.start_soon(exited)
        group.start_soon(accept)
        group.cancel_scope.deadline = anyio.current_time() + timeout
    if accepted:
        return accepted[0]
    if process.returncode is None:
        await _end(process, 0.0)
        ended = f"did not connect within {timeout:g} s and was killed"
    else:
        ended = f"exited ({exit_status(process)}) before it connected"
    printed = await _printed(stderr)
    raise WorkerLost(f"the worker (pid {process.pid}) {ended}; {printed}", stderr=stderr.text())


async def _end(process: WorkerRun, grace: float) -> None:
    with anyio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
