"""`mlx-relay serve` as a user runs it: the console script, in its own process, on loopback or a Unix socket."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stages.models.blas import preload_blas
from tests import loopback
from tests.conftest import REPO, STARTUP_TIMEOUT, _free_port

pytestmark = pytest.mark.slow
SCRIPT = Path(sys.executable).parent / "mlx-relay"


def _env(**settings: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_")}
    return clean | {"MLX_RELAY_DEMO_MODEL": "tiny"} | {f"MLX_RELAY_{k.upper()}": v for k, v in settings.items()}


def _run(*args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], cwd=REPO, env=_env(**settings), capture_output=True, text=True, timeout=120
    )


def _listening(path: str) -> bool:
    # Probed by hand: httpx leaks its socket when a Unix-socket connect is refused.
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


@contextlib.contextmanager
def _serving(
    args: list[str],
    health: str,
    transport: httpx.HTTPTransport | None = None,
    *,
    uds: str | None = None,
    **settings: str,
) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [str(SCRIPT), "serve", *args],
        cwd=REPO,
        env=_env(**settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        with httpx.Client(transport=transport, timeout=2) as client:
            while True:
                assert process.poll() is None, process.communicate()[0]
                with contextlib.suppress(httpx.TransportError):
                    if uds is not None and not _listening(uds):
                        raise httpx.ConnectError("not yet")
                    if client.get(health).status_code == 200:
                        break
                assert time.monotonic() < deadline, "the server did not become healthy"
                time.sleep(0.2)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        # A test that ends before _stop's communicate() would leave the pipe to the garbage
        # collector, whose ResourceWarning then fails whichever later test is running.
        if process.stdout is not None:
            process.stdout.close()


def _stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    return process.returncode, output


def test_help_lists_the_serve_command() -> None:
    top = _run("--help")
    assert top.returncode == 0 and "serve" in top.stdout
    serve = _run("serve", "--help")
    assert serve.returncode == 0
    flags = (
        "--model",
        "--host",
        "--port",
        "--api-key",
        "--unix",
        "--insecure-no-auth",
        "--reset-store",
        "--embedding-model",
        "--adapters",
    )
    for flag in flags:
        assert flag in serve.stdout


def test_help_names_the_real_default_model() -> None:
    """SmolLM2 is served when no model is named, not the random demo model."""
    # Run from this checkout: the console script imports the package the venv installed.
    command = [sys.executable, "-m", "mlx_relay", "serve", "--help"]
    serve = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert serve.returncode == 0
    assert "SmolLM2" in " ".join(serve.stdout.split()) and "the demo model" not in serve.stdout


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.com"])
def test_a_public_address_needs_a_key(host: str) -> None:
    """One line saying why and what to do, exit 2, nothing bound."""
    refused = _run("serve", "--host", host, "--port", str(_free_port()))
    assert refused.returncode == 2
    assert (
        refused.stderr.count("\n") == 1 and "--insecure-no-auth" in refused.stderr and "Traceback" not in refused.stderr
    )


def test_a_corrupt_store_is_one_line_and_reset_store_moves_it_aside(tmp_path: Path) -> None:
    """A damaged SQLite file stops start-up with advice; --reset-store keeps it aside and starts empty."""
    store = tmp_path / "responses.db"
    store.write_bytes(b"this is not a database " * 300)
    url = f"sqlite:///{store}"
    refused = _run("serve", "--port", str(_free_port()), response_store=url)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr + refused.stdout
    assert "--reset-store" in refused.stderr and "not a database" in refused.stderr
    port = _free_port()
    with _serving(
        ["--port", str(port), "--reset-store"], f"http://127.0.0.1:{port}/health", response_store=url
    ) as process:
        kept = list(tmp_path.glob("responses.db.corrupt-*"))
        assert [path.read_bytes() for path in kept if path.name.count("-") == 1] == [b"this is not a database " * 300]
        with sqlite3.connect(store) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] >= 1
        status, _ = _stop(process)
    assert status == 0


def _given(how: str, flag: str, value: str) -> tuple[list[str], dict[str, str]]:
    """A setting as `serve`'s flag or as its MLX_RELAY_* variable."""
    return ([flag, value], {}) if how == "flag" else ([], {flag.removeprefix("--").replace("-", "_"): value})


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_bad_adapter_list_is_one_line(tmp_path: Path, how: str) -> None:
    args, settings = _given(how, "--adapters", f"sql={tmp_path}")
    refused = _run("serve", "--port", str(_free_port()), *args, **settings)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "adapter 'sql'" in refused.stderr and "adapter_config.json" in refused.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_encoder_embedding_model_is_refused_in_one_line(tmp_path: Path, how: str) -> None:
    """Only decoder embedding models that mlx-lm loads are served; a BERT-like one is named as such before start."""
    (tmp_path / "config.json").write_text('{"model_type": "bert", "hidden_size": 384}')
    args, settings = _given(how, "--embedding-model", str(tmp_path))
    refused = _run("serve", "--port", str(_free_port()), *args, **settings)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "is an encoder (bert)" in refused.stderr


def test_a_store_from_a_newer_version_is_refused_with_advice(tmp_path: Path) -> None:
    store = tmp_path / "responses.db"
    with contextlib.closing(sqlite3.connect(store)) as db:
        db.execute("PRAGMA user_version = 99")
        db.commit()
    refused = _run("serve", "--port", str(_free_port()), response_store=f"sqlite:///{store}")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and "--reset-store" in refused.stderr


def test_flags_override_the_environment_and_sigterm_drains() -> None:
    """--api-key wins over MLX_RELAY_API_KEY; a taken port is one line; SIGTERM ends the server with status 0."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with _serving(["--port", str(port), "--api-key", "from-flag"], f"{base}/health", api_key="from-env") as process:
        assert loopback.get(f"{base}/v1/models", headers={"x-api-key": "from-flag"}, timeout=10).status_code == 200
        assert loopback.get(f"{base}/v1/models", headers={"x-api-key": "from-env"}, timeout=10).status_code == 401
        # The command chose its BLAS before its imports reached mlx, so it runs on the one this process chose (the
        # Linux wheel's reference BLAS, chosen by importing mlx first, made a request on a 2-layer model 3x slower).
        stats = loopback.get(f"{base}/stats", headers={"x-api-key": "from-flag"}, timeout=10).json()
        assert stats["blas"] == preload_blas()
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert (
            loopback.post(
                f"{base}/v1/chat/completions", json=chat, headers={"x-api-key": "from-flag"}, timeout=30
            ).status_code
            == 200
        )
        # A second server on the same port is refused in one line before it loads anything; the first serves on.
        second = _run("serve", "--port", str(port), "--api-key", "k")
        assert second.returncode == 2
        assert second.stderr == f"mlx-relay: cannot listen on 127.0.0.1:{port}: Address already in use\n"
        assert "fleet.loading" not in second.stdout
        assert loopback.get(f"{base}/v1/models", headers={"x-api-key": "from-flag"}, timeout=10).status_code == 200
        status, output = _stop(process)
    assert status == 0, output
    assert "server.stopped" in output


def test_the_uvloop_setting_serves_a_stream_on_uvloop() -> None:
    """MLX_RELAY_LOOP=uvloop (here by --loop) runs the server on uvloop's loop, and a stream comes through whole."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with _serving(["--port", str(port), "--loop", "uvloop"], f"{base}/health") as process:
        usage = {"include_usage": True}
        body = {"prompt": "Hi", "max_tokens": 8, "stream": True, "ignore_eos": True, "stream_options": usage}
        with loopback.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as reply:
            frames = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
        # A reader that falls behind gets several tokens in one frame, so the count comes from the usage frame.
        assert reply.status_code == 200 and frames[-1] == "[DONE]"
        chunks = [json.loads(frame) for frame in frames[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 8
        assert "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
        status, output = _stop(process)
    assert status == 0, output
    assert "server.ready" in output and "uvloop" in output


def test_a_unix_socket_is_owner_only_and_replaces_only_a_stale_file(tmp_path: Path) -> None:
    path = tmp_path / "relay.sock"
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as stale:
        stale.bind(str(path))  # a socket file nobody listens on, as a killed server leaves it
    transport = httpx.HTTPTransport(uds=str(path))
    with _serving(["--unix", str(path)], "http://relay/health", transport, uds=str(path)) as process:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_ISSOCK(path.stat().st_mode)
        second = _run("serve", "--unix", str(path))
        assert second.returncode == 2 and "already listening" in second.stderr
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path))) as client:
            assert client.get("http://relay/v1/models", timeout=10).status_code == 200
        status, _ = _stop(process)
    assert status == 0
    assert not path.exists()


def test_a_unix_path_that_is_not_a_socket_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    refused = _run("serve", "--unix", str(path))
    assert refused.returncode == 2 and "not a socket" in refused.stderr
    assert path.read_text() == "keep me"
