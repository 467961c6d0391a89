"""A sharded server on one machine: N ranks over the ring backend on loopback, as `mlx.launch` starts them.

Each rank is `mlx-relay serve --shard …` in its own process, with the two
variables `mlx.launch` sets (MLX_RANK, and MLX_HOSTFILE naming every
rank's loopback address); started here rather than by the launcher so a
test can kill or stop one follower (the launcher ends every rank when
one exits).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import httpx

from tests import loopback
from tests.conftest import HEALTH_POLL_S, STARTUP_TIMEOUT, Server, _free_port, record_start, start_process
from tests.server_launcher import LaunchedProcess


@attrs.define
class Sharded:
    server: Server
    followers: list[subprocess.Popen[bytes] | LaunchedProcess]

    def health(self) -> httpx.Response:
        return loopback.get(f"{self.server.base_url}/health", timeout=5)

    def kill(self) -> None:
        self.server.kill()
        for follower in self.followers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(follower.pid, signal.SIGKILL)
            follower.wait()


def start_sharded(log_dir: Path, *, model: str, ranks: int = 2, mode: str = "tensor", **settings: str) -> Sharded:
    port = _free_port()
    hostfile = log_dir / f"hosts-{port}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in range(ranks)]))
    env = {
        **os.environ,
        "MLX_HOSTFILE": str(hostfile),
        "MLX_RELAY_DEMO_MODEL": "tiny",
        **{f"MLX_RELAY_{k.upper()}": v for k, v in settings.items()},
    }
    command = [sys.executable, "-m", "mlx_relay", "serve", "--model", model, "--shard", mode, "--port", str(port)]
    processes = []
    for rank in range(ranks):
        log_path = log_dir / f"shard-{port}-rank{rank}.log"
        with log_path.open("wb") as log_file:
            processes.append(start_process(command, {**env, "MLX_RANK": str(rank)}, log_file.fileno()))
    sharded = Sharded(
        Server(f"http://127.0.0.1:{port}", processes[0], log_dir / f"shard-{port}-rank0.log"), processes[1:]
    )
    started = time.monotonic()
    deadline = started + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if any(process.poll() is not None for process in processes):
            sharded.kill()
            raise RuntimeError(f"a rank exited early:\n{sharded.server.logs()}")
        with contextlib.suppress(httpx.TransportError):
            if sharded.health().status_code == 200:
                record_start(f"shard-{mode}-{ranks}", {"model": model, **settings}, time.monotonic() - started)
                return sharded
        time.sleep(HEALTH_POLL_S)
    sharded.kill()
    raise RuntimeError(f"sharded server did not become healthy:\n{sharded.server.logs()}")
