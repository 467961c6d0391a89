"""The tests' `mlx-relay serve` servers, forked from an interpreter that has done the app's imports.

A server's start was mostly an interpreter importing mlx, mlx-lm, `transformers`, Quart and the MCP SDK:
about 1.8 s of CPU of a tiny model's 2.4 s start, and the suite starts about a hundred servers. So each pytest
process starts one launcher (`python -m tests.server_launcher FD`), which imports what `mlx-relay serve` imports,
then forks a server for each request, as the front's zygote forks its workers (stages/remote/zygote.py,
`serve_forks`), where the zygote would (`fork_suits`: Linux, the CPU backend; elsewhere every server is spawned).
The child runs `python -m mlx_relay serve ...` as the interpreter would, in its own session, with
the test's environment, directory and log file; its exit status comes back through a pipe, as a worker's does.

Only the `MLX_RELAY_*` settings (and `_READ_LATE`) may differ from the launcher's environment: they are read as
the server starts (pipeline/settings.py). A library may read any other variable as it loads (the BLAS's thread
count, huggingface_hub's endpoint), and a module on a changed PYTHONPATH is not on a fork's path, so a server whose
environment differs there is spawned as before (`Launcher.serves`). The default server runs as `hypercorn
app:app`, spawned, and the serve command's own tests start their processes themselves.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stages.remote.zygote import fork_suits, read_exit_status, request_fork, run_module_as_main, serve_forks

_SETTINGS_PREFIX = "MLX_RELAY_"
# Variables that may differ too: nothing reads them as it loads. pytest names the running test in one; litellm,
# once a test imports it, sets tiktoken's cache directory, which tiktoken reads as it opens an encoding; a sharded
# rank's two (`mlx.launch`'s) are read by `mx.distributed.init` as the shard's cluster starts (stages/shard/).
_READ_LATE = frozenset({"PYTEST_CURRENT_TEST", "TIKTOKEN_CACHE_DIR", "MLX_RANK", "MLX_HOSTFILE"})
_REPLY_BYTES = 1024


class LaunchedProcess:
    """A server the launcher forked, with the face of `subprocess.Popen` the tests use: pid, returncode, poll,
    wait, send_signal, kill. Its exit status is read from the pipe the launcher writes it to once reaped."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd = status_fd

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._status_fd], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._status_fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(["mlx-relay", "serve"], timeout or 0.0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        # Once its status is read the launcher has reaped it, and the pid may be another process's.
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_status(self) -> None:
        self.returncode = read_exit_status(self._status_fd)


class Launcher:
    """One pytest process's launcher: started on first use, ended with the process (its end of the pair closes)."""

    def __init__(self) -> None:
        control, launcher_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = launcher_end.fileno()
        self.environment = dict(os.environ)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.server_launcher", str(fd)],
            cwd=Path(__file__).resolve().parent.parent,
            pass_fds=[fd],
            stdin=subprocess.DEVNULL,
        )
        launcher_end.close()
        self._control = control
        # The launcher says it is ready once its imports are done (a fork before then would import in the child),
        # or why it cannot fork here (the zygote's reasons: not Linux, a GPU backend); then every server spawns.
        self.refusal: str | None = None
        ready = self._control.recv(_REPLY_BYTES)
        if ready != b"ready":
            self.refusal = ready.decode(errors="replace") or "the launcher ended as it started"

    def serves(self, environment: Mapping[str, str]) -> bool:
        """Whether a server with `environment` may be forked: nothing but the settings differ from the launcher's."""
        if self.refusal is not None or self._process.poll() is not None:
            return False
        return _without_settings(environment) == _without_settings(self.environment)

    def launch(self, argv: Sequence[str], environment: Mapping[str, str], cwd: Path, output_fd: int) -> LaunchedProcess:
        """Forks `python -m mlx_relay *argv` with `environment` in `cwd`, its stdout and stderr `output_fd`."""
        request = {"argv": list(argv), "environment": dict(environment), "cwd": str(cwd)}
        reply, status_read = request_fork(self._control, request, output_fd)
        if not reply.isdigit():
            os.close(status_read)
            raise OSError(f"the server launcher could not fork: {reply.decode(errors='replace')}")
        return LaunchedProcess(int(reply), status_read)

    def close(self) -> None:
        self._control.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)


_SHARED: list[Launcher] = []


def shared_launcher() -> Launcher:
    """This pytest process's launcher, started on its first use."""
    if not _SHARED:
        _SHARED.append(Launcher())
    return _SHARED[0]


def close_shared_launcher() -> None:
    while _SHARED:
        _SHARED.pop().close()


def _without_settings(environment: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in environment.items()
        if not name.startswith(_SETTINGS_PREFIX) and name not in _READ_LATE
    }


def _server_main(request: dict[str, Any], output_fd: int) -> None:
    def start() -> None:
        # A session of its own, as `start_new_session=True` gives a spawned server: teardown kills its group.
        os.setsid()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        os.environ.clear()
        os.environ.update(request["environment"])
        os.chdir(request["cwd"])

    run_module_as_main("mlx_relay", request["argv"], start)


def _launcher_main(fd: int) -> None:
    control = socket.socket(fileno=fd)
    code = 0
    try:
        # What `mlx-relay serve` imports before it reads a setting: the CLI (which preloads the BLAS first) and
        # the app's modules, but not `app`, which builds the app from the settings.
        import mlx_relay  # noqa: F401
        from edge import application  # noqa: F401

        if (reason := fork_suits("auto")) is not None:
            control.send(reason.encode())
            return
        control.send(b"ready")
        serve_forks(control, _server_main)
    except BaseException:  # noqa: BLE001 -- the launcher's own failure: the tests spawn their servers instead
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.dont_write_bytecode = False
    _launcher_main(int(sys.argv[1]))
