"""The tests' server launcher (tests/server_launcher.py): a forked server is the serve command's, settings and all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import loopback
from tests.conftest import start_server
from tests.server_launcher import LaunchedProcess, shared_launcher

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _forks_here() -> None:
    if (refusal := shared_launcher().refusal) is not None:
        pytest.skip(f"the launcher does not fork here: {refusal}")


def parent_pid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_launched_server_reads_its_own_settings_and_its_sigterm_exit_status_comes_back(tmp_path: Path) -> None:
    server = start_server(tmp_path, model_name="launched", model_aliases="other=launched")
    try:
        assert isinstance(server.process, LaunchedProcess)
        # The launcher's child, in a session of its own (teardown kills its process group).
        assert parent_pid(server.process.pid) != os.getpid()
        assert os.getsid(server.process.pid) == server.process.pid
        models = loopback.get(f"{server.v1}/models", timeout=10).json()
        assert [model["id"] for model in models["data"]] == ["launched", "other"]
        assert server.process.poll() is None
        assert server.stop() == 0
        assert server.process.poll() == 0
    finally:
        server.kill()


def test_a_bad_setting_exits_two_with_its_one_line(tmp_path: Path) -> None:
    env = {**shared_launcher().environment, "MLX_RELAY_MAX_BATCH": "many"}
    log = tmp_path / "bad.log"
    with log.open("wb") as output:
        process = shared_launcher().launch(["serve", "--port", "0"], env, tmp_path, output.fileno())
    assert process.wait(timeout=60) == 2
    assert "mlx-relay:" in log.read_text() and "MLX_RELAY_MAX_BATCH" in log.read_text()


def test_only_the_settings_may_differ_from_the_launchers_environment() -> None:
    launcher = shared_launcher()
    same = dict(launcher.environment)
    assert launcher.serves({**same, "MLX_RELAY_MAX_BATCH": "3", "PYTEST_CURRENT_TEST": "another"})
    # Set by litellm as a test imports it, read by tiktoken only as it opens an encoding.
    assert launcher.serves({**same, "TIKTOKEN_CACHE_DIR": "/elsewhere"})
    # A library may read any other variable as it loads: such a server is spawned.
    assert not launcher.serves({**same, "MKL_NUM_THREADS": "7"})
    assert not launcher.serves({name: value for name, value in same.items() if name != "PATH"})
    # huggingface_hub reads its endpoint as it loads; a model module on PYTHONPATH is not on a fork's sys.path.
    assert not launcher.serves({**same, "HF_ENDPOINT": "http://127.0.0.1:1"})
    assert not launcher.serves({**same, "PYTHONPATH": "/somewhere"})
