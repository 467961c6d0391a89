"""Finding a server's model workers from outside: /health's worker, and the process tree the front makes."""

from __future__ import annotations

import time
from pathlib import Path

from tests import loopback
from tests.conftest import Server


def model_state(server: Server) -> dict[str, object]:
    body = loopback.get(f"{server.base_url}/health", timeout=10).json()
    (model,) = body["models"]
    assert isinstance(model, dict)
    return model


def wait_ready(server: Server, *, other_than: int | None = None, timeout: float = 60.0) -> int:
    """The pid of a ready worker (a new one, when `other_than` is given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = model_state(server)
        if model["state"] == "ready" and model["pid"] != other_than:
            pid = model["pid"]
            assert isinstance(pid, int)
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no ready worker within {timeout} s: {model_state(server)}")


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def process_name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def front_pid(worker_pid: int) -> int:
    """The front a worker serves: its parent, or its zygote's parent where the zygote forked it."""
    parent = parent_pid(worker_pid)
    return parent_pid(parent) if process_name(parent) == "relay-zygote" else parent


def rss_kib(pid: int) -> int:
    """A process's resident set, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
