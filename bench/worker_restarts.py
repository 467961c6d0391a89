"""The front's memory over many model worker restarts: `python -m bench.worker_restarts [--restarts 50]`.

Starts mlx-relay on `tiny` with a short restart back-off, then kills its
model worker (SIGKILL) again and again; after each restart one request is
answered. Prints the front's RSS (from /proc) after each restart and the
growth from the fifth restart to the last (the first ones warm caches).
"""

from __future__ import annotations

import argparse
import os
import signal
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_restarts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=50)
    args = parser.parse_args()
    port = free_port()
    env = relay_env("tiny", frozenset(DEMO_MODELS)) | {"MLX_RELAY_WORKER_RESTART_BACKOFF": "0.05"}
    with started("mlx-relay", relay_command(port), port, env, OUT / "logs") as server:
        pid = _ready_pid(server.url, None)
        front = _parent(pid)
        samples: list[int] = []
        began = time.monotonic()
        for restart in range(1, args.restarts + 1):
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            pid = _ready_pid(server.url, pid)
            body = {"prompt": "hi", "max_tokens": 4}
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
            samples.append(_rss_kib(front))
            print(
                f"restart {restart}: back in {time.monotonic() - killed:.2f} s, front RSS {samples[-1] / 1024:.1f} MiB"
            )
        base = samples[min(4, len(samples) - 1)]
        print(
            f"\n{args.restarts} restarts in {time.monotonic() - began:.0f} s; front RSS after restart 5:"
            f" {base / 1024:.1f} MiB, after the last: {samples[-1] / 1024:.1f} MiB"
            f" ({(samples[-1] - base) / 1024:+.1f} MiB)"
        )


if __name__ == "__main__":
    main()
