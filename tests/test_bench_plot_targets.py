"""`python -m bench.plot_targets` draws docs/real-models.png from the benches' summaries, and refuses a summary that
lacks a ratio rather than drawing a figure with a point missing.

Run as its users run it, in a process of its own: tests/ does not import bench/ (docs/DESIGN.md, "Layout").
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

FIGURES = REPO / "docs" / "figures"
CHAT = [FIGURES / "interleaved-smollm2.json", FIGURES / "interleaved-gemma3.json"]
REPLAY = FIGURES / "agent_replay-smollm2.json"


def _plot(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bench.plot_targets", *map(str, args)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib comes with the `bench` extra, which the README's test install leaves out",
)
def test_the_published_figures_draw_one_png(tmp_path: Path) -> None:
    out = tmp_path / "targets.png"
    result = _plot("--chat", *CHAT, "--replay", REPLAY, "--out", out)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_summary_without_a_ratio_is_refused_by_name(tmp_path: Path) -> None:
    summary = json.loads(CHAT[0].read_text())
    del summary["levels"]["16"]["relay / raw tok/s"]
    cut = tmp_path / "interleaved.json"
    cut.write_text(json.dumps(summary))
    out = tmp_path / "targets.png"
    result = _plot("--chat", cut, "--out", out)
    assert result.returncode != 0
    assert f"{cut}: no 'relay / raw tok/s' at level 16" in result.stderr
    assert not out.exists()
