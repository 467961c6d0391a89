"""The repository's own files, found without walking what tools keep inside it.

A clean clone's `.venv` holds some 25,000 files; a `Path.rglob` per pattern walked all of them at every
collection, in every test process, before the filter threw them away.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO

TOOL_FOLDERS = frozenset({".venv", ".git", ".ruff_cache", ".mypy_cache", ".pytest_cache", "__pycache__"})
# What the benches write (git ignores it): their logs, plots, and the llama.cpp source they build a peer from.
BENCH_OUT = REPO / "bench" / "out"


def repo_files(*suffixes: str) -> list[Path]:
    """Every file under the repository whose name ends in one of `suffixes`, sorted, tool folders left out."""
    found: list[Path] = []
    for root, folders, files in os.walk(REPO):
        folders[:] = [f for f in folders if f not in TOOL_FOLDERS and Path(root, f) != BENCH_OUT]
        found += [Path(root, name) for name in files if name.endswith(suffixes)]
    return sorted(found)
