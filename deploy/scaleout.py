"""N mlx-relay replicas on one machine behind an existing router: smg (cache-aware) or HAProxy.

    python deploy/scaleout.py --replicas 3 --router smg --policy cache_aware --port 8080
    python deploy/scaleout.py --replicas 3 --router haproxy --port 8080

Replica i serves on 127.0.0.1:(base-port + i); all share one Responses
store (`--store`, default a SQLite file in the run folder, which serves one
host; give `postgresql://...` for replicas on several hosts). The model and
every other setting come from the environment (`MLX_RELAY_MODEL`, ...), as
for one server. smg is `pip install 'mlx-relay[scaleout]'`; HAProxy is the
`haproxy` package. Ctrl-C stops everything. `bench/scaleout.py` drives the
same `Cluster`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
import httpx

REPO = Path(__file__).resolve().parent.parent
HAPROXY_TEMPLATE = REPO / "deploy" / "haproxy.cfg"
STARTUP_SECONDS = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = STARTUP_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not become healthy in {timeout:.0f} s; see {log}")


@attrs.define
class Replica:
    index: int
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@attrs.define
class Cluster:
    """Replicas and a router, each a process group of its own; `stop` ends them all."""

    run_dir: Path
    store: str
    replicas: list[Replica] = attrs.field(factory=list)
    router: subprocess.Popen[bytes] | None = None
    router_url: str | None = None

    @classmethod
    def create(cls, store: str | None = None, run_dir: Path | None = None) -> Cluster:
        folder = run_dir or Path(tempfile.mkdtemp(prefix="mlx-relay-scaleout-"))
        folder.mkdir(parents=True, exist_ok=True)
        return cls(run_dir=folder, store=store or f"sqlite:///{folder / 'responses.db'}")

    def start_replicas(self, count: int, *, base_port: int | None = None, env: dict[str, str] | None = None) -> None:
        for index in range(count):
            port = base_port + index if base_port else free_port()
            log = self.run_dir / f"replica-{index}.log"
            environment = {**os.environ, "MLX_RELAY_RESPONSE_STORE": self.store, **(env or {})}
            command = [
                sys.executable,
                "-m",
                "hypercorn",
                "app:app",
                "--bind",
                f"127.0.0.1:{port}",
                "--graceful-timeout",
                "10",
                "--access-logfile",
                "-",
            ]
            with log.open("wb") as out:
                process = subprocess.Popen(
                    command, cwd=REPO, env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            self.replicas.append(Replica(index, port, process, log))
        for replica in self.replicas:
            wait_healthy(replica.url, replica.process, replica.log)

    def start_smg(self, *, policy: str = "cache_aware", port: int | None = None) -> str:
        """smg in HTTP mode over the replicas; its URL once it routes."""
        port = port or free_port()
        log = self.run_dir / f"smg-{policy}.log"
        command = [
            sys.executable,
            "-m",
            "smg",
            "launch",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *(replica.url for replica in self.replicas),
            "--policy",
            policy,
            "--prometheus-port",
            str(free_port()),
            "--prometheus-host",
            "127.0.0.1",
            # Failover within seconds: probe each replica every second, drop it after two misses.
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "2",
            "--load-monitor-interval",
            "2",
            "--log-level",
            "warn",
        ]
        return self._start_router(command, log, port)

    def start_haproxy(self, *, port: int | None = None) -> str:
        haproxy = shutil.which("haproxy")
        if haproxy is None:
            raise RuntimeError("haproxy is not installed (Debian: apt-get install haproxy)")
        port = port or free_port()
        config = self.run_dir / "haproxy.cfg"
        config.write_text(haproxy_config(HAPROXY_TEMPLATE.read_text(), port, [r.port for r in self.replicas]))
        log = self.run_dir / "haproxy.log"
        return self._start_router([haproxy, "-db", "-f", str(config)], log, port)

    def _start_router(self, command: list[str], log: Path, port: int) -> str:
        with log.open("wb") as out:
            self.router = subprocess.Popen(
                command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.router_url = f"http://127.0.0.1:{port}"
        wait_healthy(self.router_url, self.router, log, timeout=60.0)
        return self.router_url

    def stop_router(self) -> None:
        if self.router is not None:
            _end(self.router)
            self.router = self.router_url = None

    def kill_replica(self, index: int) -> None:
        """SIGKILL, as a crash or a lost host: nothing drains."""
        process = self.replicas[index].process
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        self.stop_router()
        for replica in self.replicas:
            _end(replica.process)


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def haproxy_config(template: str, port: int, replica_ports: list[int]) -> str:
    """The shipped configuration with this run's front port and one `server` line per replica."""
    lines = [line for line in template.splitlines() if not line.strip().startswith("server r")]
    lines = [line.replace("bind 127.0.0.1:8080", f"bind 127.0.0.1:{port}") for line in lines]
    lines += [f"    server r{i + 1} 127.0.0.1:{p}" for i, p in enumerate(replica_ports)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--base-port", type=int, default=8001, help="replica i listens on base-port + i")
    parser.add_argument("--router", choices=("smg", "haproxy"), default="smg")
    parser.add_argument("--policy", default="cache_aware", help="smg's routing policy (cache_aware, round_robin, ...)")
    parser.add_argument("--port", type=int, default=8080, help="the router's port")
    parser.add_argument("--store", help="the shared Responses store URL (default: a SQLite file in the run folder)")
    parser.add_argument("--run-dir", type=Path, help="logs and the default store (default: a new temporary folder)")
    args = parser.parse_args()
    cluster = Cluster.create(args.store, args.run_dir)
    try:
        cluster.start_replicas(args.replicas, base_port=args.base_port)
        url = (
            cluster.start_smg(policy=args.policy, port=args.port)
            if args.router == "smg"
            else cluster.start_haproxy(port=args.port)
        )
        print(f"{args.router} on {url} over {[r.url for r in cluster.replicas]}; logs in {cluster.run_dir}", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
