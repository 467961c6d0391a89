"""The source passes mypy --strict (docs/STYLE.md, "Strict typing"): a type error fails the suite."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_mypy_strict_passes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
