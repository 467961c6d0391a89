"""The SQLite response store on real files: durability, several store objects and processes on one file, damaged
files and unknown schemas.

The behaviour both stores share is tested in test_response_store.py.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from store.response_store import StoreError
from store.sqlite import SqliteResponseStore
from tests.conftest import REPO
from tests.store.test_response_store import (
    SIZE,
    ids,
    record,
    run_threads,
    write_and_read,
)


def sqlite_store(path: Path | str, *, max_bytes: int = 10**7, busy_timeout: float = 5.0) -> SqliteResponseStore:
    return SqliteResponseStore(path, ttl_seconds=3600.0, max_bytes=max_bytes, busy_timeout=busy_timeout)


def test_records_survive_close_and_reopen(tmp_path: Path) -> None:
    """Durability, and the LRU order with it: after a restart the same record is evicted first."""
    path = tmp_path / "nested" / "folder" / "r.db"
    first = sqlite_store(path, max_bytes=3 * SIZE)
    for n in (1, 2, 3):
        first.put(record(n))
    first.get(record(1).id)
    first.close()
    second = sqlite_store(path, max_bytes=3 * SIZE)
    try:
        assert second.get(record(3).id) == record(3)
        second.put(record(4))
        assert ids(second, 1, 2, 3, 4) == [1, 3, 4]
    finally:
        second.close()


def test_two_store_objects_on_one_file_share_records(tmp_path: Path) -> None:
    """Two stores on one file stand in for two hypercorn workers: 4 threads each write, both read everything."""
    path = tmp_path / "r.db"
    stores = [sqlite_store(path), sqlite_store(path)]
    try:
        run_threads(8, lambda t: write_and_read(stores[t % 2], range(t * 50, t * 50 + 50)))
        for store in stores:
            assert store.statistics().entries == 400
            assert ids(store, *range(400)) == list(range(400))
    finally:
        for store in stores:
            store.close()


WRITER = """
import sys
from tests.store.test_sqlite import sqlite_store, write_and_read
store = sqlite_store(sys.argv[1])
write_and_read(store, range(int(sys.argv[2]), int(sys.argv[2]) + 100))
store.close()
"""


def test_separate_processes_write_one_fresh_file(tmp_path: Path) -> None:
    """Two real processes open a file that does not exist yet, and write to it beside this one's threads."""
    path = tmp_path / "r.db"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(start)], cwd=REPO, stderr=subprocess.PIPE)
        for start in (1000, 2000)
    ]
    local = sqlite_store(path)
    try:
        run_threads(4, lambda t: write_and_read(local, range(t * 25, t * 25 + 25)))
        for writer in writers:
            _, stderr = writer.communicate(timeout=60)
            assert writer.returncode == 0, stderr.decode()
        expected = [*range(100), *range(1000, 1100), *range(2000, 2100)]
        assert ids(local, *expected) == expected
    finally:
        local.close()


def test_a_file_that_is_not_a_database_fails_to_open(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    path.write_bytes(b"this is not a database" * 64)
    with pytest.raises(StoreError, match="open failed"):
        sqlite_store(path)


def test_a_folder_that_cannot_be_made_fails_to_open(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError, match="open failed"):
        sqlite_store(tmp_path / "file" / "r.db")


def test_a_database_destroyed_while_open_fails_each_call(tmp_path: Path) -> None:
    """The file is overwritten under a running store: every call is a StoreError, and close still works."""
    path = tmp_path / "r.db"
    store = sqlite_store(path)
    store.put(record(1))
    for file in tmp_path.glob("r.db*"):
        file.write_bytes(b"this is not a database" * 64)
    with pytest.raises(StoreError, match="put failed"):
        store.put(record(2))
    with pytest.raises(StoreError, match="get failed"):
        store.get(record(1).id)
    with pytest.raises(StoreError, match="statistics failed"):
        store.statistics()
    store.close()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        pytest.param(["PRAGMA user_version = 99"], "schema 99, newer", id="newer"),
        pytest.param(["CREATE TABLE users (id INTEGER)"], "not a response store", id="another-apps-file"),
        pytest.param(
            ["CREATE TABLE responses (id TEXT PRIMARY KEY, record TEXT)", "PRAGMA user_version = 1"],
            "not a response store",
            id="same-version-other-columns",
        ),
        pytest.param(["PRAGMA user_version = 1"], "not a response store", id="version-without-table"),
    ],
)
def test_an_unknown_schema_is_refused(tmp_path: Path, setup: list[str], message: str) -> None:
    path = tmp_path / "r.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        for statement in setup:
            db.execute(statement)
        db.commit()
    with pytest.raises(StoreError, match=message):
        sqlite_store(path)


def test_a_corrupt_row_fails_that_read_only(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    store = sqlite_store(path)
    try:
        store.put(record(1))
        store.put(record(2))
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("UPDATE responses SET body = '{not json' WHERE id = ?", (record(1).id,))
            db.commit()
        with pytest.raises(StoreError, match="corrupt"):
            store.get(record(1).id)
        assert store.get(record(2).id) == record(2)
        assert store.delete(record(1).id) is True
    finally:
        store.close()


def test_a_writer_that_waits_too_long_fails_cleanly_then_recovers(tmp_path: Path) -> None:
    """Another process holding the write lock past busy_timeout is a StoreError, not a crash or a stuck lock."""
    path = tmp_path / "r.db"
    store = sqlite_store(path, busy_timeout=0.05)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="locked"):
            store.put(record(1))
        blocker.execute("ROLLBACK")
        store.put(record(1))
        assert store.get(record(1).id) == record(1)
    finally:
        blocker.close()
        store.close()


def test_an_open_that_meets_a_locked_file_waits_for_it(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.2, blocker.execute, args=("ROLLBACK",))
    release.start()
    try:
        store = sqlite_store(path, busy_timeout=10.0)
        store.put(record(1))
        assert store.get(record(1).id) == record(1)
        store.close()
    finally:
        release.join()
        blocker.close()


def test_an_open_that_stays_locked_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreError, match="open failed: database is locked"):
            sqlite_store(path, busy_timeout=0.05)
    finally:
        blocker.close()
