"""A sharded server at rest costs no CPU, and its ranks stop when their launcher is gone (issue 22 item 9).

The launcher's test is also the one of starting a sharded server the documented way, with `mlx.launch`.

Measured before: an idle 2-rank tensor group on `tiny` spent 0.43 of a
core on the follower, which waited for rank 0's next step inside a
collective (the ring backend polls); and ranks whose `mlx.launch` was
ended by a signal went on running, rank 0 still serving HTTP.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests import loopback
from tests.conftest import REPO, Server, _free_port
from tests.e2e.shard_harness import start_sharded

pytestmark = pytest.mark.slow

USER = [{"role": "user", "content": "hi"}]
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of `pid` so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cores_used(pids: list[int], seconds: float) -> list[float]:
    """The share of a core each of `pids` used over the same `seconds`."""
    before = [cpu_seconds(pid) for pid in pids]
    time.sleep(seconds)
    return [(cpu_seconds(pid) - start) / seconds for pid, start in zip(pids, before, strict=True)]


def test_an_idle_follower_sleeps(tmp_path: Path) -> None:
    sharded = start_sharded(tmp_path, model="tiny")
    try:
        reply = sharded.server.client().chat.completions.create(model="m", messages=USER, max_tokens=8)  # type: ignore[arg-type]
        assert reply.choices[0].message.content is not None
        time.sleep(1.0)  # the last step's work and the cache's housekeeping settle
        follower, leader = cores_used([sharded.followers[0].pid, sharded.server.process.pid], 3.0)
        # Heartbeats (a line every 0.5 s) and the launcher watch (a look every second) are all that runs.
        assert follower < 0.05, f"the idle follower used {follower:.3f} of a core"
        assert leader < 0.05, f"the idle rank 0 used {leader:.3f} of a core"
        # And it wakes for the next step.
        again = sharded.server.client().chat.completions.create(model="m", messages=USER, max_tokens=8)  # type: ignore[arg-type]
        assert again.choices[0].message.content is not None
    finally:
        sharded.kill()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sent", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_mlx_launch_starts_a_sharded_server_whose_ranks_stop_when_it_is_gone(
    tmp_path: Path, sent: signal.Signals
) -> None:
    """The documented way, `mlx.launch --backend ring -n 2 -- mlx-relay serve --shard tensor`, serves from every
    rank; ended by a signal, the launcher takes its ranks with it."""
    port = _free_port()
    launcher = Path(sys.executable).parent / "mlx.launch"
    launch = [str(launcher), "--backend", "ring", "-n", "2", "--python", sys.executable, "--"]
    command = [*launch, "-m", "mlx_relay", "serve", "--model", "tiny", "--shard", "tensor", "--port", str(port)]
    log_path = tmp_path / "launch.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if loopback.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        health = loopback.get(f"{server.base_url}/health", timeout=5).json()
        assert [rank["alive"] for rank in health["ranks"]] == [True, True], server.logs()
        reply = server.client().chat.completions.create(model="m", messages=USER, max_tokens=4, temperature=0)  # type: ignore[arg-type]
        assert reply.choices[0].message.content
        ranks = _children(process.pid)
        assert len(ranks) == 2, server.logs()
        os.kill(process.pid, sent)
        process.wait(timeout=30)
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and any(_alive(rank) for rank in ranks):
            time.sleep(0.3)
        assert not any(_alive(rank) for rank in ranks), server.logs()[-3000:]
        with pytest.raises(httpx.TransportError):
            loopback.get(f"{server.base_url}/health", timeout=2)
    finally:
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank, signal.SIGKILL)
        server.kill()
