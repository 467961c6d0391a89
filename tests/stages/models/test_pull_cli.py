"""`mlx-relay pull`, `models` and `rm` end to end: the console script against the loopback Hub (tests/hub.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub import Hub, served_files

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def hub(tiny_model: Path) -> Iterator[Hub]:
    served = Hub()
    served.add("test/tiny", tiny_model)
    with served.running() as running:
        yield running


def _cli(hub: Hub, cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), **env}
    command = [sys.executable, "-m", "mlx_relay", *args]
    return subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=120)


def test_pull_prints_fit_and_progress_then_models_and_rm(hub: Hub, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    pulled = _cli(hub, cache, "pull", "test/tiny")
    assert pulled.returncode == 0, pulled.stderr
    assert Path(pulled.stdout.strip()) == cache / "models--test--tiny" / "snapshots" / hub.repos["test/tiny"].commit
    assert "this machine: fits" in pulled.stderr
    # The last progress line: every byte, a rate and the time left.
    total = sum(file.size for file in hub.repos["test/tiny"].files.values())
    last = [line for line in pulled.stderr.splitlines() if "left" in line][-1]
    assert "[####################]" in last and "/s" in last and "0:00 left" in last
    assert f"{total / 1e3:.1f} kB / {total / 1e3:.1f} kB" in last
    listed = _cli(hub, cache, "models", "--fit")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("test/tiny") and "fits" in listed.stdout
    assert "   8 GB  yes" in listed.stdout and " 512 GB  yes" in listed.stdout
    removed = _cli(hub, cache, "rm", "test/tiny")
    assert removed.returncode == 0 and not (cache / "models--test--tiny").exists()
    again = _cli(hub, cache, "rm", "test/tiny")
    assert again.returncode == 2 and "not in the Hugging Face cache" in again.stderr


def test_pull_refuses_a_model_over_the_budget_before_its_weights(hub: Hub, tmp_path: Path) -> None:
    refused = _cli(hub, tmp_path / "cache", "pull", "test/tiny", MLX_RELAY_MEMORY_BUDGET="100000")
    assert refused.returncode == 2
    assert "does not fit" in refused.stderr and "nothing was downloaded" in refused.stderr
    assert list(served_files(hub)) == ["config.json"]
    forced = _cli(hub, tmp_path / "cache", "pull", "test/tiny", "--force", MLX_RELAY_MEMORY_BUDGET="100000")
    assert forced.returncode == 0, forced.stderr


def test_pull_of_an_unknown_repository_is_one_line(hub: Hub, tmp_path: Path) -> None:
    missing = _cli(hub, tmp_path / "cache", "pull", "test/absent")
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "mlx-relay: repository test/absent not found (or it is private or gated: set HF_TOKEN)"
    )
