"""One model worker process: started, connected over a private Unix socket, and ended.

The front listens on a socket (0600) in a temporary folder of its own
(0700), starts `python -m workers.main --socket PATH` with the front's
environment (so the worker reads the same `MLX_RELAY_*` settings) and
accepts the one connection the worker makes. Leaving the context ends the
process: a drained worker is given `grace` seconds to exit, then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import attrs
from anyio.abc import ByteStream, Process, SocketListener

# workers/priority.py's YIELD_FLAG (the front does not import workers/).
_YIELD_FLAG = "--yield-while-loading"
# The repository's root: the worker imports the same sources as the front.
_ROOT = Path(__file__).resolve().parents[2]


class WorkerLost(Exception):
    """The worker ended, or stopped answering, before its work was done."""


class WorkerRefused(Exception):
    """The worker cannot serve its model with these settings; the message is the worker's reason."""


@attrs.define(eq=False)
class WorkerProcess:
    process: Process
    stream: ByteStream

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def worker_process(
    *, connect_timeout: float, grace: float = 0.0, yield_cpu: bool = False
) -> AsyncIterator[WorkerProcess]:
    """A started, connected worker; it is ended on exit. `yield_cpu`: it starts nicer (workers/priority.py).

    Raises:
        WorkerLost: the worker exited, or did not connect within `connect_timeout`.
    """
    with tempfile.TemporaryDirectory(prefix="mlx-relay-worker-") as folder:
        path = Path(folder) / "worker.sock"
        async with await anyio.create_unix_listener(path, mode=0o600) as listener:
            path_entries = filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path_entries)}
            process = await anyio.open_process(
                [sys.executable, "-m", "workers.main", "--socket", str(path), *([_YIELD_FLAG] if yield_cpu else [])],
                stdin=subprocess.DEVNULL,
                stdout=None,
                stderr=None,
                env=env,
            )
            worker: WorkerProcess | None = None
            try:
                stream = await _accept(listener, process, connect_timeout)
                worker = WorkerProcess(process=process, stream=stream)
                async with stream:
                    yield worker
            finally:
                with anyio.CancelScope(shield=True):
                    await _end(process, grace)


async def _accept(listener: SocketListener, process: Process, timeout: float) -> ByteStream:
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
    if not accepted:
        raise WorkerLost(f"the worker (pid {process.pid}) did not connect (exit status {process.returncode})")
    return accepted[0]


async def _end(process: Process, grace: float) -> None:
    with anyio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
