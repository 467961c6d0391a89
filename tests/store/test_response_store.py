"""store/: every store keeps one policy, on real files, a real PostgreSQL server and real threads."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import attrs
import pytest

from store.opening import open_store, store_path
from store.response_store import (
    EncodedResponse,
    MemoryResponseStore,
    ResponseStore,
    StoredResponse,
    StoreError,
)

Kind = Literal["memory", "sqlite", "postgresql"]


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
        input_items=(
            {"role": "user", "content": "Hi ☕"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ),
        instructions=instructions,
    )


SIZE = EncodedResponse.encode(record(0)).size

StoreFactory = Callable[..., ResponseStore]


# PostgreSQL's cases start a server (once a session) and a database each: slow.
@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def kind(request: pytest.FixtureRequest) -> Kind:
    value: Kind = request.param
    return value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_store(kind: Kind, clock: FakeClock, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    opened: list[ResponseStore] = []
    url = {
        "memory": lambda: "memory",
        "sqlite": lambda: f"sqlite:///{tmp_path / 'responses.db'}",
        "postgresql": lambda: request.getfixturevalue("postgres").new_database(),
    }[kind]()

    def make(*, ttl_seconds: float = 100.0, max_bytes: int = 10**7) -> ResponseStore:
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
    expected = {"memory": None, "sqlite": str(tmp_path / "responses.db")}
    if kind == "postgresql":
        assert figures.location is not None and figures.location.startswith("postgresql://postgres@127.0.0.1:")
    else:
        assert figures.location == expected[kind]
    assert (figures.entries, figures.bytes) == (2, 2 * SIZE + len("Be brief."))
    assert (figures.max_bytes, figures.ttl_seconds) == (10 * SIZE, 60.0)
    assert (figures.hits, figures.misses, figures.evictions, figures.expirations, figures.oversized) == (1, 1, 0, 0, 0)
    assert set(attrs.asdict(figures)) >= {
        "kind",
        "entries",
        "bytes",
        "max_bytes",
        "ttl_seconds",
        "hits",
        "misses",
        "evictions",
    }


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


def test_a_relative_sqlite_url_opens_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:data/r.db", ttl_seconds=1.0, max_bytes=10**6)
    try:
        assert store.statistics().location == str(tmp_path / "data" / "r.db")
        assert (tmp_path / "data" / "r.db").is_file()
    finally:
        store.close()


# -- SQLite only: durability, processes, damage -------------------------------------------------------------------
