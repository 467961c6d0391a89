"""The front's copy that forks model workers: a worker's start without the interpreter's start and its imports.

A spawned worker spends about a second of CPU importing what the front has
already imported (mlx, mlx-lm and through it `transformers`). So the front
forks itself once, first thing in its lifespan while it has one thread,
and that copy (the zygote) waits on a socket pair: for each worker it
forks a child, which runs `workers.main` as `python -m workers.main` would,
its imports already done. The front passes the worker's stderr pipe and a
status pipe with each request (SCM_RIGHTS); the zygote, the worker's
parent, reaps it and writes its exit status (four bytes) into the status
pipe, which the front's `ForkedProcess.wait()` reads.

Only where a fork is safe and gives the worker what a spawn would
(`fork_suits`): Linux, the CPU backend (a CUDA context, or Metal's
Objective-C runtime, does not survive a fork), the front on its one Python
thread (a lock another thread held at the fork stays held in the child),
and the front's environment as it was at the fork (a library may read a
variable once, as it loads); the one difference a worker may have, its
share of the BLAS threads, its BLAS is told through its own call. Elsewhere, or with `MLX_RELAY_WORKER_FORK=off`,
workers are spawned as before. The zygote ends when the front closes its
end (or dies); its workers, whose sockets are the front's, end with it.
The fork loop (`serve_forks`), its request (`request_fork`), a child's run
(`run_module_as_main`) and its exit status (`read_exit_status`) also serve
the tests' server launcher (tests/server_launcher.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs
import structlog

log = structlog.get_logger(stage="remote")

# The exit status the zygote writes: a signed int, the returncode's convention (-N: killed by signal N).
_STATUS = struct.Struct("=i")
# A request (the worker's argv and added environment, JSON) and its reply (its pid, or why a fork failed):
# one datagram each.
_REQUEST_BYTES = 65536
_REPLY_BYTES = 1024
# The worker's module, run as `python -m` runs it.
_WORKER_MODULE = "workers.main"
# What ps and top call a worker and the zygote (a forked process's command line is the front's): at most 15 bytes.
WORKER_NAME = "relay-worker"
_ZYGOTE_NAME = "relay-zygote"


class ForkedProcess:
    """A worker forked by the zygote: anyio's `Process` as the worker's supervision uses it (pid, returncode,
    wait, kill), its exit status read from the pipe the zygote writes it to."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd = status_fd
        # One task reads the status; another that waits meanwhile (anyio allows one reader an fd) waits on it.
        self._reading = anyio.Lock()

    async def wait(self) -> int:
        async with self._reading:
            while self.returncode is None:
                await anyio.wait_readable(self._status_fd)
                self._read_status()
        return self.returncode

    def kill(self) -> None:
        # Once its status is read the zygote has reaped it, and the pid may be another process's.
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _read_status(self) -> None:
        self.returncode = read_exit_status(self._status_fd)


def read_exit_status(status_fd: int) -> int:
    """The exit status a `serve_forks` loop wrote into a child's status pipe, which is closed here; -SIGKILL where the
    pipe ended without one (the forking process died first, and nothing can tell how the child ended)."""
    data = b""
    while len(data) < _STATUS.size and (chunk := os.read(status_fd, _STATUS.size - len(data))):
        data += chunk
    os.close(status_fd)
    return _STATUS.unpack(data)[0] if len(data) == _STATUS.size else -signal.SIGKILL


def request_fork(control: socket.socket, request: dict[str, Any], output_fd: int) -> tuple[bytes, int]:
    """Asks a `serve_forks` loop for a child: its reply (the pid in digits, why the fork failed, or nothing once the
    loop has ended) and the read end of the child's status pipe, the caller's to close (`read_exit_status`).

    Raises:
        OSError: the request could not be sent or its reply read.
    """
    status_read, status_write = os.pipe()
    try:
        socket.send_fds(control, [json.dumps(request).encode()], [output_fd, status_write])
        reply = control.recv(_REPLY_BYTES)
    except BaseException:
        os.close(status_read)
        raise
    finally:
        os.close(status_write)
    return reply, status_read


@attrs.define(eq=False)
class Zygote:
    pid: int
    control: socket.socket
    # The environment at the fork: a worker that would need another is spawned instead.
    environment: dict[str, str]
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _broken: bool = False

    def serves(self) -> bool:
        """Whether the next worker may be forked: the zygote is there, and the front's environment is still the
        one it forked with."""
        return not self._broken and dict(os.environ) == self.environment

    def fork_worker(self, argv: Sequence[str], stderr_fd: int, thread_counts: Mapping[str, str]) -> tuple[int, int]:
        """Forks a worker running `python -m workers.main *argv`, its stderr `stderr_fd` (the caller closes its
        copy), `thread_counts` added to its environment (the BLAS share, which the worker gives its BLAS through
        the BLAS's own call: stages/models/blas.py): its pid and the read end of its status pipe
        (`ForkedProcess`). Blocking for the few milliseconds of a fork: call it on a thread.

        Raises:
            OSError: the zygote is gone (it is not asked again) or could not fork; the caller spawns.
        """
        with self._lock:
            try:
                reply, status_read = request_fork(
                    self.control, {"argv": list(argv), "environment": dict(thread_counts)}, stderr_fd
                )
            except OSError:
                self._lost()
                raise
            if not reply:
                os.close(status_read)
                self._lost()
                raise OSError("the worker zygote has ended")
        if not reply.isdigit():
            os.close(status_read)
            raise OSError(f"the worker zygote could not fork: {reply.decode(errors='replace')}")
        return int(reply), status_read

    def close(self) -> None:
        """Ends the zygote: it exits once its end of the pair reads the end (reaped here if it already has)."""
        self.control.close()
        self._lost(closing=True)

    def _lost(self, *, closing: bool = False) -> None:
        """Not asked again (workers are spawned from now on); reaped if it has ended. Its workers serve on: their
        sockets are the front's, and a status pipe that ends with no status reads as killed."""
        if not self._broken and not closing:
            log.warning("worker.zygote_lost", pid=self.pid)
        self._broken = True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)


_ZYGOTE: Zygote | None = None


def current_zygote() -> Zygote | None:
    return _ZYGOTE


def fork_suits(mode: str) -> str | None:
    """Why workers are spawned rather than forked here, or None when they may be forked."""
    if mode == "off":
        return "MLX_RELAY_WORKER_FORK=off"
    if sys.platform != "linux":
        return "not Linux"
    from stages.kv.machine import backend

    if (device := backend()) != "cpu":
        return f"the {device} backend"
    # Python's threads only: a BLAS's idle pool (numpy's OpenBLAS starts one as it loads) is shut down and made
    # again around a fork by the library's own fork handlers, as for any multiprocessing fork.
    if (threads := threading.active_count()) != 1:
        return f"the front already runs {threads} threads"
    return None


def start_zygote(mode: str, *, preimport: Callable[[], None] | None = None) -> None:
    """Forks the zygote when it suits (the lifespan calls it before anything starts a thread). `preimport`, run in
    the zygote alone before it forks any worker, imports what only some workers need (a speech model's), so the
    front and a fleet that needs none of it never pay for it."""
    global _ZYGOTE
    if _ZYGOTE is not None:
        return
    if (reason := fork_suits(mode)) is not None:
        log.info("worker.spawned_not_forked", reason=reason)
        return
    front_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # Buffered output would be written again by every copy.
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _zygote_main(zygote_end, preimport)
    zygote_end.close()
    _ZYGOTE = Zygote(pid=pid, control=front_end, environment=dict(os.environ))
    log.info("worker.zygote", pid=pid)


def stop_zygote() -> None:
    global _ZYGOTE
    if _ZYGOTE is not None:
        _ZYGOTE.close()
        _ZYGOTE = None


def _zygote_main(control: socket.socket, preimport: Callable[[], None] | None) -> None:
    """The zygote's whole life; it never returns into the front's code."""
    code = 0
    try:
        name_process(_ZYGOTE_NAME)
        _quiet_inherited(keep_open={0, 1, 2, control.fileno()})
        if preimport is not None:
            _preimport(preimport)
        serve_forks(control, _worker_main)
    except BaseException:  # noqa: BLE001 -- printed, then the process exits; it never unwinds into the front's code
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _preimport(preimport: Callable[[], None]) -> None:
    # A worker that needed it imports it itself, and fails there with the reason, as a spawned one would.
    started = time.perf_counter()
    try:
        preimport()
    except ImportError as error:
        log.warning("worker.zygote_preimport_failed", reason=str(error))
        return
    log.info("worker.zygote_preimported", seconds=round(time.perf_counter() - started, 3))


def name_process(name: str) -> None:
    """The process's name in ps, top and /proc (Linux); elsewhere nothing."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(name)


def _quiet_inherited(*, keep_open: set[int]) -> None:
    """Points every descriptor inherited from the front (its listening sockets, its store's files) at /dev/null:
    a port stays the front's alone. The numbers stay taken, so an object of the front's that closes its
    descriptor in this copy closes /dev/null, never a descriptor this process opened since."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd != null and fd not in keep_open:
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    os.close(null)


def serve_forks(control: socket.socket, child_main: Callable[[dict[str, Any], int], None]) -> None:
    """Forks a child for each request on `control` (a JSON datagram with two descriptors: the child's output and
    the write end of its status pipe), replies with its pid, and writes each child's exit status into its pipe
    once reaped. `child_main(request, output_fd)` runs in the child and never returns. Returns when the other end
    closes. The zygote serves its front so; the tests' server launcher (tests/server_launcher.py) its servers.
    """
    # Ctrl-C and a SIGTERM to the process group reach the zygote too: it ends when the front closes its end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    # A handler of its own, so SIGCHLD reaches the wake-up pipe.
    signal.signal(signal.SIGCHLD, lambda _signal, _frame: None)
    status_fds: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([control.fileno(), wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(status_fds)
        if control.fileno() in ready:
            message, fds, _, _ = socket.recv_fds(control, _REQUEST_BYTES, 2)
            if not message:
                return  # the front closed its end, or died
            output_fd, status_fd = fds
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as error:
                # Too many processes, too little memory: the front spawns this one instead, and asks again next time.
                os.close(output_fd)
                os.close(status_fd)
                control.send(str(error).encode()[:_REPLY_BYTES])
                continue
            if pid == 0:
                for fd in (control.detach(), wake_read, wake_write, status_fd, *status_fds.values()):
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                child_main(json.loads(message), output_fd)
            os.close(output_fd)
            status_fds[pid] = status_fd
            control.send(b"%d" % pid)
            _reap(status_fds)


def _reap(status_fds: dict[int, int]) -> None:
    while status_fds:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        fd = status_fds.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, _STATUS.pack(os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _worker_main(request: dict[str, Any], stderr_fd: int) -> None:
    """The forked worker: `python -m workers.main *argv` with its stderr on the front's pipe; never returns."""

    def start() -> None:
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.update(request["environment"])

    run_module_as_main(_WORKER_MODULE, request["argv"], start)


def run_module_as_main(module: str, argv: Sequence[str], start: Callable[[], None]) -> None:
    """In a forked child: `start()`, then `python -m module *argv` as the interpreter would run it, then the
    process exits with its status; never returns into the forking process's code."""
    code = 0
    try:
        start()
        sys.argv = [module, *argv]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as ended:
        code = _exit_code(ended.code)
    except BaseException:  # noqa: BLE001 -- printed as the interpreter would, then the exit status 1
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_code(code: object) -> int:
    """What the interpreter makes of `SystemExit(code)`: a message is printed and exits 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
