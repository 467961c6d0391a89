"""A response store that will not open: advice in one line, or moved aside with reset_store."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from edge.redact import without_paths
from pipeline.settings import Settings
from store.store_startup import StartupError, open_response_store

GARBAGE = b"not a database at all " * 200


def _settings(store: Path, *, reset: bool = False) -> Settings:
    return Settings(response_store=f"sqlite:///{store}", reset_store=reset)


def test_a_corrupt_file_is_refused_with_a_way_forward(tmp_path: Path) -> None:
    store = tmp_path / "r.db"
    store.write_bytes(GARBAGE)
    with pytest.raises(StartupError) as refused:
        open_response_store(_settings(store))
    message = str(refused.value)
    assert "\n" not in message and "--reset-store" in message and "MLX_RELAY_RESET_STORE" in message
    assert store.read_bytes() == GARBAGE


def test_reset_moves_a_corrupt_file_aside_and_starts_empty(tmp_path: Path) -> None:
    store = tmp_path / "r.db"
    store.write_bytes(GARBAGE)
    open_response_store(_settings(store, reset=True)).close()
    kept = [path.name for path in tmp_path.iterdir() if ".corrupt-" in path.name]
    assert len(kept) == 1 and kept[0].startswith("r.db.corrupt-")
    assert (tmp_path / kept[0]).read_bytes() == GARBAGE
    with contextlib.closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone() == (0,)


def test_reset_keeps_a_healthy_store(tmp_path: Path) -> None:
    store = tmp_path / "r.db"
    open_response_store(_settings(store)).close()
    open_response_store(_settings(store, reset=True)).close()
    assert [path.name for path in tmp_path.iterdir() if ".corrupt-" in path.name] == []


def test_a_bad_url_is_a_settings_problem_not_a_reset(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="MLX_RELAY_RESPONSE_STORE"):
        # Refused at once (nothing listens on port 9), given up on after the URL's connect_timeout.
        open_response_store(Settings(response_store="postgres://db@127.0.0.1:9/x?connect_timeout=1", reset_store=True))


def test_reports_carry_no_paths() -> None:
    report = {"model": "/home/me/models/Qwen3", "nested": [{"dir": "~/cache"}, "C:\\m\\x"], "n": 3, "name": "relay"}
    assert without_paths(report) == {"model": "Qwen3", "nested": [{"dir": "cache"}, "x"], "n": 3, "name": "relay"}
