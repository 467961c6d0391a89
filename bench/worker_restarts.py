"""The front's memory and the restart time over many model worker restarts: `python -m bench.worker_restarts`.

Starts mlx-relay on `tiny` with a short restart back-off, then kills its
model worker (SIGKILL) again and again; after each restart one request is
answered. Prints the front's RSS (from /proc) after each restart and the
growth from the fifth restart to the last (the first ones warm caches),
and the median time from the kill to a ready worker, with the spare worker
`--spare on` or `off` (stages/remote/spare.py), workers forked by the
front's zygote or, `--fork off`, spawned (stages/remote/zygote.py):
`--settle` seconds between restarts give a spare time to import, as the
time between real crashes does.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
from pathlib import Path

import httpx

from bench.servers import free_port, relay_command, relay_env, started
from stages.models.demo import DEMO_MODELS

OUT = Path(__file__).resolve().parent / "out"


def _model(url: str) -> dict[str, object]:
    (model,) = httpx.get(f"{url}/health", timeout=10).json()["models"]
    assert isinstance(model, dict)
    return model


def _ready_pid(url: str, other_than: int | None, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = _model(url)
        if model["state"] == "ready" and model["pid"] != other_than and isinstance(model["pid"], int):
            return model["pid"]
        time.sleep(0.05)
    raise SystemExit(f"no ready worker within {timeout} s")


def _rss_kib(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1])


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _front(worker: int) -> int:
    """The worker's front: its parent, or its zygote's (stages/remote/zygote.py)."""
    parent = _parent(worker)
    return _parent(parent) if Path(f"/proc/{parent}/comm").read_text().strip() == "relay-zygote" else parent


def _workers(front: int) -> list[int]:
    """The front's worker processes (a spare among them): its children, or its zygote's, named as workers."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or (entry / "comm").read_text().strip() != "relay-worker":
                continue
            parent = _parent(int(entry.name))
            if front in (parent, _parent(parent)):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_restarts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=50)
    parser.add_argument("--spare", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--fork", choices=("auto", "off"), default="auto", help="MLX_RELAY_WORKER_FORK")
    parser.add_argument("--settle", type=float, default=0.0, help="seconds between a restart and the next kill")
    args = parser.parse_args()
    port = free_port()
    env = relay_env("tiny", frozenset(DEMO_MODELS)) | {
        "MLX_RELAY_WORKER_RESTART_BACKOFF": "0.05",
        "MLX_RELAY_WORKER_SPARE": args.spare,
        "MLX_RELAY_WORKER_FORK": args.fork,
    }
    with started("mlx-relay", relay_command(port), port, env, OUT / "logs") as server:
        pid = _ready_pid(server.url, None)
        front = _front(pid)
        samples: list[int] = []
        back_in: list[float] = []
        began = time.monotonic()
        for restart in range(1, args.restarts + 1):
            time.sleep(args.settle)
            spares = [_rss_kib(other) for other in _workers(front) if other != pid]
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            pid = _ready_pid(server.url, pid)
            back_in.append(time.monotonic() - killed)
            took = _model(server.url).get("spare")
            body = {"prompt": "hi", "max_tokens": 4}
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
            samples.append(_rss_kib(front))
            idle = f", idle spare RSS {spares[0] / 1024:.1f} MiB" if spares else ""
            print(
                f"restart {restart}: back in {back_in[-1]:.2f} s (spare taken: {took}),"
                f" front RSS {samples[-1] / 1024:.1f} MiB{idle}"
            )
        base = samples[min(4, len(samples) - 1)]
        print(
            f"\n{args.restarts} restarts in {time.monotonic() - began:.0f} s; front RSS after restart 5:"
            f" {base / 1024:.1f} MiB, after the last: {samples[-1] / 1024:.1f} MiB"
            f" ({(samples[-1] - base) / 1024:+.1f} MiB); kill to ready: median {statistics.median(back_in):.2f} s"
        )


if __name__ == "__main__":
    main()
