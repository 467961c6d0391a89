"""Start the servers under test as subprocesses on free loopback ports.

Both servers load the same model directory and the same BLAS: mlx-relay
preloads OpenBLAS itself (stages/models/blas.py), and mlx_lm.server gets the same
preload from a two-line launcher, so the comparison is between servers,
not between matrix libraries.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx

REPO = Path(__file__).resolve().parent.parent
# Loading a large model from disk can take minutes; the demo model takes seconds.
STARTUP_TIMEOUT = 300.0
# hypercorn is started with --graceful-timeout 30; allow it that and a little.
STOP_TIMEOUT = 45.0
# mlx_lm.server has no BLAS choice of its own: preload, then run its own main().
_MLX_LM_LAUNCHER = "from stages.models.blas import preload_blas; preload_blas(); from mlx_lm.server import main; main()"


@attrs.frozen
class Server:
    name: str
    url: str
    # None for a server the benchmark did not start (`--url`): it is left running.
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None


def relay_command(port: int) -> list[str]:
    # The model loads in the app's lifespan; hypercorn's 60 s for it ran out loading Gemma 3 at load average 14.
    config = ["--config", f"file:{Path(__file__).resolve().parent / 'relay_hypercorn.py'}"]
    return [
        sys.executable,
        "-m",
        "hypercorn",
        *config,
        "app:app",
        "--bind",
        f"127.0.0.1:{port}",
        "--graceful-timeout",
        "30",
    ]


def serve_command(port: int) -> list[str]:
    """mlx-relay as the README starts it, `mlx-relay serve`: one process, where `relay_command`'s hypercorn CLI
    serves from a process it spawns."""
    return [sys.executable, "-m", "mlx_relay", "serve", "--port", str(port), "--graceful-timeout", "30"]


def relay_env(model: str, demo_names: frozenset[str]) -> dict[str, str]:
    """The environment that makes mlx-relay serve `model` (a demo name, path or repo id)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLX_RELAY_MODEL", "MLX_RELAY_DEMO_MODEL")}
    if model in demo_names:
        env["MLX_RELAY_DEMO_MODEL"] = model
    else:
        env["MLX_RELAY_MODEL"] = model
    return env


def mlx_lm_command(model_path: str, port: int) -> list[str]:
    # Everything else stays at mlx_lm.server's defaults (decode batch 32,
    # prefill batch 8, temperature 0): the peer as its users run it.
    return [sys.executable, "-c", _MLX_LM_LAUNCHER, "--model", model_path, "--host", "127.0.0.1", "--port", str(port)]


def float32_copy(path: Path, folder: Path) -> Path:
    """`path`'s weights dequantized to float32 by mlx_lm's converter, made once under `folder`.

    Float32 is what mlx-relay serves on a Linux CPU (stages/models/weights.py), so mlx_lm.server and raw
    mlx-lm compare with it as servers, not weight forms. `--dtype float32` matters: `-d` alone keeps the
    model's own 16-bit type (the directories without the `-float32` suffix, made before, are 16-bit).
    """
    dest = folder / f"{path.name}-float32"
    if not (dest / "config.json").exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(path), "--mlx-path", str(dest)]
        subprocess.run([*command, "-d", "--dtype", "float32"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return dest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def started(
    name: str, command: list[str], port: int, env: Mapping[str, str], log_dir: Path, *, cwd: Path = REPO
) -> Iterator[Server]:
    """A healthy server for the duration of the block, stopped on the way out; `cwd`: the checkout whose app runs."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, cwd=cwd, env=dict(env), stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(name, f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_healthy(server)
        yield server
    finally:
        stop(process)


def wait_healthy(server: Server, timeout: float = STARTUP_TIMEOUT) -> None:
    """Poll /health until 200.

    Raises:
        RuntimeError: the process exited, or the deadline passed; with the log's tail.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}:\n{log_tail(server)}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{server.name} was not healthy after {timeout:.0f} s:\n{log_tail(server)}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def log_tail(server: Server, lines: int = 40) -> str:
    if server.log_path is None or not server.log_path.exists():
        return "(no log)"
    return "\n".join(server.log_path.read_text(errors="replace").splitlines()[-lines:])
