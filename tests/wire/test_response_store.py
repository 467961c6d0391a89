"""wire/response_store*.py: both stores keep one policy, on real files and real threads."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import attrs
import pytest

from tests.conftest import REPO
from wire.response_store import (
    EncodedResponse,
    MemoryResponseStore,
    ResponseStore,
    StoredResponse,
    StoreError,
    open_store,
    store_path,
)
from wire.response_store_sqlite import SqliteResponseStore

Kind = Literal["memory", "sqlite"]


@attrs.define
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def record(n: int, *, text: str = "hello", instructions: str | None = None) -> StoredResponse:
    response_id = f"resp_{n:04d}"
    return StoredResponse(
        id=response_id,
        created_at=1_700_000_000.0 + n,
        body={"id": response_id, "object": "response", "output": [{"type": "message", "text": text}], "usage": None},
        input_items=({"role": "user", "content": "Hi ☕"}, {"type": "function_call_output", "call_id": "c1", "output": "42"}),
        instructions=instructions,
    )


SIZE = EncodedResponse.encode(record(0)).size

StoreFactory = Callable[..., ResponseStore]


@pytest.fixture(params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> Kind:
    value: Kind = request.param
    return value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_store(kind: Kind, clock: FakeClock, tmp_path: Path) -> Iterator[StoreFactory]:
    opened: list[ResponseStore] = []

    def make(*, ttl_seconds: float = 100.0, max_bytes: int = 10**7) -> ResponseStore:
        url = "memory" if kind == "memory" else f"sqlite:///{tmp_path / 'responses.db'}"
        store = open_store(url, ttl_seconds=ttl_seconds, max_bytes=max_bytes, clock=clock)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def ids(store: ResponseStore, *numbers: int) -> list[int]:
    """Which of the given records are still stored (each read refreshes it)."""
    return [n for n in numbers if store.get(record(n).id) is not None]


# -- one policy, both stores --------------------------------------------------------------------------------------


def test_put_get_delete_round_trip(make_store: StoreFactory) -> None:
    """A stored record reads back equal, instructions and non-ASCII text included; delete removes it once."""
    store = make_store()
    original = record(1, text="日本語 ☕", instructions="Be brief.")
    store.put(original)
    assert store.get(original.id) == original
    assert store.delete(original.id) is True
    assert store.get(original.id) is None
    assert store.delete(original.id) is False


def test_unknown_ids_are_none_and_false(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.get("resp_missing") is None
    assert store.delete("resp_missing") is False


def test_put_replaces_a_record_with_the_same_id(make_store: StoreFactory) -> None:
    store = make_store()
    store.put(record(1, text="old"))
    store.put(record(1, text="new"))
    assert store.get(record(1).id) == record(1, text="new")
    assert store.statistics().entries == 1


def test_get_returns_a_copy_the_caller_may_mutate(make_store: StoreFactory) -> None:
    """A store hands out decoded copies: mutating one changes nothing stored."""
    store = make_store()
    original = record(1)
    store.put(original)
    fetched = store.get(original.id)
    assert fetched is not None
    fetched.body["output"] = []
    fetched.input_items[0]["content"] = "changed"
    assert store.get(original.id) == original


def test_ttl_runs_from_the_last_use(make_store: StoreFactory, clock: FakeClock) -> None:
    """A record lives ttl seconds after it was stored or last read; at exactly ttl it is gone."""
    store = make_store(ttl_seconds=10.0)
    store.put(record(1))
    clock.now += 9.0
    assert ids(store, 1) == [1]
    clock.now += 9.0  # 18 s after the put, 9 after the read
    assert ids(store, 1) == [1]
    clock.now += 10.0
    assert ids(store, 1) == []
    figures = store.statistics()
    assert (figures.hits, figures.misses, figures.expirations, figures.entries) == (2, 1, 1, 0)


def test_expired_records_are_swept_when_another_is_stored(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(ttl_seconds=10.0)
    store.put(record(1))
    clock.now += 5.0
    store.put(record(2))
    clock.now += 6.0
    store.put(record(3))
    figures = store.statistics()
    assert (figures.entries, figures.bytes, figures.expirations) == (2, 2 * SIZE, 1)
    assert ids(store, 2, 3) == [2, 3]


def test_delete_of_an_expired_record_is_false(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(ttl_seconds=10.0)
    store.put(record(1))
    clock.now += 10.0
    assert store.delete(record(1).id) is False
    assert store.statistics().entries == 0


def test_an_infinite_ttl_never_expires(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(ttl_seconds=math.inf)
    store.put(record(1))
    clock.now += 1e12
    store.put(record(2))
    assert ids(store, 1, 2) == [1, 2]


def test_the_byte_cap_evicts_least_recently_used_first(make_store: StoreFactory) -> None:
    """Reads count as use; uses in the same clock tick still keep their order."""
    store = make_store(max_bytes=3 * SIZE)
    for n in (1, 2, 3):
        store.put(record(n))
    assert store.get(record(1).id) is not None  # 2 is now the least recently used
    store.put(record(4))
    assert store.get(record(2).id) is None
    store.put(record(5))  # then 3
    assert ids(store, 1, 3, 4, 5) == [1, 4, 5]
    figures = store.statistics()
    assert (figures.entries, figures.bytes, figures.evictions) == (3, 3 * SIZE, 2)


def test_a_large_record_evicts_as_many_as_it_needs(make_store: StoreFactory) -> None:
    store = make_store(max_bytes=4 * SIZE)
    for n in (1, 2, 3, 4):
        store.put(record(n))
    big = record(9, text="x" * (2 * SIZE))
    store.put(big)
    assert store.get(big.id) == big
    assert ids(store, 1, 2, 3, 4) == [4]
    assert store.statistics().evictions == 3


def test_a_record_of_exactly_max_bytes_is_kept(make_store: StoreFactory) -> None:
    store = make_store(max_bytes=SIZE)
    store.put(record(1))
    store.put(record(2))
    assert ids(store, 1, 2) == [2]


def test_an_oversized_record_is_not_stored_and_drops_its_older_version(make_store: StoreFactory) -> None:
    """A record over the cap on its own is refused and counted; the others stay, and no stale copy answers."""
    store = make_store(max_bytes=3 * SIZE)
    store.put(record(1))
    store.put(record(2))
    store.put(record(2, text="x" * (3 * SIZE)))
    assert ids(store, 1, 2) == [1]
    figures = store.statistics()
    assert (figures.entries, figures.bytes, figures.oversized, figures.evictions) == (1, SIZE, 1, 0)


def test_statistics_figures(make_store: StoreFactory, kind: Kind, tmp_path: Path) -> None:
    store = make_store(ttl_seconds=60.0, max_bytes=10 * SIZE)
    store.put(record(1))
    store.put(record(2, instructions="Be brief."))
    store.get(record(1).id)
    store.get("resp_missing")
    figures = store.statistics()
    assert figures.kind == kind
    assert figures.location == (None if kind == "memory" else str(tmp_path / "responses.db"))
    assert (figures.entries, figures.bytes) == (2, 2 * SIZE + len("Be brief."))
    assert (figures.max_bytes, figures.ttl_seconds) == (10 * SIZE, 60.0)
    assert (figures.hits, figures.misses, figures.evictions, figures.expirations, figures.oversized) == (1, 1, 0, 0, 0)
    assert set(attrs.asdict(figures)) >= {"kind", "entries", "bytes", "max_bytes", "ttl_seconds", "hits", "misses", "evictions"}


def test_size_is_the_utf8_length_of_the_json(make_store: StoreFactory) -> None:
    encoded = EncodedResponse.encode(record(1, instructions="é"))
    texts = (encoded.id, encoded.body, encoded.input_items, "é")
    assert encoded.size == sum(len(t.encode()) for t in texts)
    assert "☕" in encoded.input_items  # not \u-escaped: the cap counts real bytes


def test_a_record_json_cannot_encode_is_a_store_error(make_store: StoreFactory) -> None:
    store = make_store()
    bad = attrs.evolve(record(1), body={"id": "resp_0001", "value": {1, 2}})  # type: ignore[dict-item]
    with pytest.raises(StoreError, match="cannot be stored as JSON"):
        store.put(bad)
    assert store.statistics().entries == 0


def test_a_closed_store_refuses_work(make_store: StoreFactory) -> None:
    store = make_store()
    store.put(record(1))
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.get(record(1).id)
    with pytest.raises(StoreError, match="closed"):
        store.put(record(2))


def test_concurrent_writers_on_one_store(make_store: StoreFactory) -> None:
    """8 threads × 50 put-then-get on one store: no errors, nothing lost."""
    store = make_store()
    run_threads(8, lambda t: write_and_read(store, range(t * 50, t * 50 + 50)))
    assert store.statistics().entries == 400
    assert ids(store, *range(400)) == list(range(400))


def write_and_read(store: ResponseStore, numbers: range) -> None:
    for n in numbers:
        store.put(record(n))
        assert store.get(record(n).id) == record(n)


def run_threads(count: int, work: Callable[[int], None]) -> None:
    """Runs work(0..count-1) on real threads started together; re-raises the first failure."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def body(index: int) -> None:
        try:
            start.wait()
            work(index)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("url", [None, "", "memory", "memory://", "  memory  "])
def test_open_store_defaults_to_memory(url: str | None) -> None:
    store = open_store(url, ttl_seconds=1.0, max_bytes=1)
    assert isinstance(store, MemoryResponseStore)
    assert store.statistics().kind == "memory"


@pytest.mark.parametrize(("ttl", "max_bytes"), [(0.0, 1), (-1.0, 1), (math.nan, 1), (1.0, 0), (1.0, -5)])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_bad_limits_are_a_store_error(ttl: float, max_bytes: int, kind: Kind, tmp_path: Path) -> None:
    url = "memory" if kind == "memory" else f"sqlite:///{tmp_path / 'r.db'}"
    with pytest.raises(StoreError, match="must be positive"):
        open_store(url, ttl_seconds=ttl, max_bytes=max_bytes)


# -- store URLs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        pytest.param(None, None, id="unset"),
        pytest.param("memory", None, id="memory"),
        pytest.param("sqlite:///var/lib/relay/r.db", Path("/var/lib/relay/r.db"), id="absolute"),
        pytest.param("sqlite:////var/lib/relay/r.db", Path("/var/lib/relay/r.db"), id="sqlalchemy-absolute"),
        pytest.param("SQLite:///r.db", Path("/r.db"), id="scheme-case"),
        pytest.param("sqlite:r.db", Path("r.db"), id="relative"),
        pytest.param("sqlite:data/r.db", Path("data/r.db"), id="relative-folder"),
        pytest.param("sqlite:///tmp/my%20store.db", Path("/tmp/my store.db"), id="percent-escape"),
    ],
)
def test_store_urls(url: str | None, path: Path | None) -> None:
    assert store_path(url) == path


@pytest.mark.parametrize(
    ("url", "message"),
    [
        pytest.param("redis://localhost/0", "unknown response store", id="other-scheme"),
        pytest.param("/var/lib/r.db", "unknown response store", id="bare-path"),
        pytest.param("sqlite", "unknown response store", id="bare-word"),
        pytest.param("memory:///x", "unknown response store", id="memory-with-path"),
        pytest.param("sqlite:", "names no database file", id="no-path"),
        pytest.param("sqlite://", "names no database file", id="no-path-slashes"),
        pytest.param("sqlite:///", "names no database file", id="root"),
        pytest.param("sqlite:///var/lib/", "names no database file", id="folder"),
        pytest.param("sqlite://host/r.db", "names a host", id="host"),
        pytest.param("sqlite:///r.db?mode=ro", "no query", id="query"),
        pytest.param("sqlite:///r.db?", "no query", id="empty-query"),
        pytest.param("sqlite:///r.db#x", "no query", id="fragment"),
        pytest.param("sqlite::memory:", "write 'memory'", id="sqlite-memory"),
    ],
)
def test_bad_store_urls_say_what_is_accepted(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        store_path(url)
    with pytest.raises(StoreError, match=message):
        open_store(url, ttl_seconds=1.0, max_bytes=1)


def test_a_relative_sqlite_url_opens_under_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:data/r.db", ttl_seconds=1.0, max_bytes=10**6)
    try:
        assert store.statistics().location == str(tmp_path / "data" / "r.db")
        assert (tmp_path / "data" / "r.db").is_file()
    finally:
        store.close()


# -- SQLite only: durability, processes, damage -------------------------------------------------------------------


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
from tests.wire.test_response_store import sqlite_store, write_and_read
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
