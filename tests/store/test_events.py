"""store/: background responses' stream events and owners, kept by every store under the one policy."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs

from store.opening import open_store
from store.response_store import StoredResponse
from tests.store.test_response_store import FakeClock, StoreFactory, clock, kind, make_store, record  # noqa: F401

EVENTS = [(0, "event: response.created\ndata: {}\n\n"), (1, "event: response.queued\ndata: {}\n\n")]


def queued(n: int) -> StoredResponse:
    base = record(n)
    return attrs.evolve(base, body={**base.body, "status": "queued"}, owner="f" * 64)


def test_events_read_back_after_a_number(make_store: StoreFactory) -> None:
    store = make_store()
    store.put(queued(1))
    store.add_events(queued(1).id, EVENTS)
    store.add_events(queued(1).id, [(2, "event: x\ndata: ☕\n\n")])
    assert [n for n, _ in store.events_after(queued(1).id, -1)] == [0, 1, 2]
    assert store.events_after(queued(1).id, 1) == [(2, "event: x\ndata: ☕\n\n")]
    assert store.events_after(queued(1).id, 2) == []


def test_events_live_as_long_as_their_record(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store(ttl_seconds=10)
    store.add_events(record(9).id, EVENTS)  # no record: nothing is kept
    assert store.events_after(record(9).id, -1) == []
    store.put(queued(1))
    store.add_events(queued(1).id, EVENTS)
    store.put(attrs.evolve(queued(1), body={**queued(1).body, "status": "in_progress"}))
    assert len(store.events_after(queued(1).id, -1)) == 2  # storing the record again keeps them
    store.delete(queued(1).id)
    assert store.events_after(queued(1).id, -1) == []
    store.put(queued(2))
    store.add_events(queued(2).id, EVENTS)
    clock.now += 20
    store.put(record(3))  # sweeps the expired record, and its events with it
    assert store.events_after(queued(2).id, -1) == []


def test_fail_unfinished_marks_only_unfinished_work(make_store: StoreFactory) -> None:
    store = make_store()
    store.put(queued(1))
    store.put(record(2))
    assert store.fail_unfinished("stopped") == 1
    failed = store.get(queued(1).id)
    assert failed is not None and failed.body["status"] == "failed"
    assert failed.body["error"] == {"code": "server_error", "message": "stopped"}
    assert failed.owner == "f" * 64
    assert store.get(record(2).id) == record(2)
    assert store.fail_unfinished("stopped") == 0


def test_a_schema_1_sqlite_file_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE responses (id TEXT PRIMARY KEY, created_at REAL NOT NULL, last_used_at REAL NOT NULL, "
            "recency INTEGER NOT NULL, size INTEGER NOT NULL, instructions TEXT, body TEXT NOT NULL, "
            "input_items TEXT NOT NULL)"
        )
        db.execute("PRAGMA user_version = 1")
    db.close()
    store = open_store(f"sqlite:///{path}", ttl_seconds=100, max_bytes=10**6)
    try:
        store.put(queued(1))
        store.add_events(queued(1).id, EVENTS)
        assert store.get(queued(1).id) == queued(1)
        assert store.events_after(queued(1).id, 0) == EVENTS[1:]
    finally:
        store.close()
