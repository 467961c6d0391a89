"""store/postgres.py against a real PostgreSQL server: what the shared policy table cannot show.

The policy itself (TTL, LRU byte cap, oversized records, copies, closing)
runs for every store in test_response_store.py; these are PostgreSQL's
own cases: replicas sharing one database, the schema, reaching the server.
"""

from __future__ import annotations

import psycopg
import pytest

from store.opening import open_store
from store.postgres import DEFAULT_CONNECT_TIMEOUT, PostgresResponseStore, connect_timeout_of, redacted
from store.response_store import StoreError
from tests.pg import PostgresServer
from tests.store.test_response_store import SIZE, record, run_threads

pytestmark = pytest.mark.slow


def store(url: str, *, max_bytes: int = 10**7, connect_timeout: float = 10.0) -> PostgresResponseStore:
    return PostgresResponseStore(url, ttl_seconds=3600.0, max_bytes=max_bytes, connect_timeout=connect_timeout)


def test_replicas_on_one_database_share_records(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    first, second = store(url), store(url)
    try:
        first.put(record(1))
        assert second.get(record(1).id) == record(1)
        assert second.delete(record(1).id)
        assert first.get(record(1).id) is None
    finally:
        first.close()
        second.close()


def test_records_survive_close_and_reopen(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    first = store(url)
    first.put(record(1, instructions="Be brief."))
    first.close()
    second = open_store(url, ttl_seconds=3600.0, max_bytes=10**7)
    try:
        assert second.get(record(1).id) == record(1, instructions="Be brief.")
    finally:
        second.close()


def test_writers_on_several_replicas_never_pass_the_cap(postgres: PostgresServer) -> None:
    """4 replicas × 25 puts into a cap of 10 records: the table never holds more, and the newest stay."""
    url = postgres.new_database()
    replicas = [store(url, max_bytes=10 * SIZE) for _ in range(4)]
    try:
        run_threads(4, lambda t: [replicas[t].put(record(t * 25 + n)) for n in range(25)])  # type: ignore[func-returns-value]
        figures = replicas[0].statistics()
        assert figures.entries == 10 and figures.bytes == 10 * SIZE
        assert sum(replica.statistics().evictions for replica in replicas) == 90
    finally:
        for replica in replicas:
            replica.close()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            [
                "CREATE TABLE mlx_relay_response_store (version INTEGER NOT NULL)",
                "INSERT INTO mlx_relay_response_store VALUES (99)",
            ],
            "newer than this server's 2",
        ),
        (
            [
                "CREATE TABLE mlx_relay_response_store (version INTEGER NOT NULL)",
                "INSERT INTO mlx_relay_response_store VALUES (1)",
                "CREATE TABLE mlx_relay_responses (id TEXT)",
            ],
            "not a response store this server knows",
        ),
    ],
    ids=["newer", "unknown-table"],
)
def test_an_unknown_schema_is_refused(postgres: PostgresServer, setup: list[str], message: str) -> None:
    url = postgres.new_database()
    with psycopg.connect(url, autocommit=True) as db:
        for statement in setup:
            db.execute(statement.encode())
    with pytest.raises(StoreError, match=message):
        store(url)


def test_a_server_that_cannot_be_reached_fails_to_open() -> None:
    with pytest.raises(StoreError, match="open failed"):
        store("postgresql://nobody:secret@127.0.0.1:9/none", connect_timeout=1.0)


def test_start_up_waits_as_long_as_the_urls_connect_timeout_says(postgres: PostgresServer) -> None:
    assert connect_timeout_of("postgresql://u@db/x") == DEFAULT_CONNECT_TIMEOUT
    assert connect_timeout_of("postgresql://u@db/x?sslmode=disable&connect_timeout=3") == 3.0
    # libpq's 0 is "wait forever": start-up keeps its own bound.
    assert connect_timeout_of("postgresql://u@db/x?connect_timeout=0") == DEFAULT_CONNECT_TIMEOUT
    assert connect_timeout_of("postgresql://u@db/x?connect_timeout=soon") == DEFAULT_CONNECT_TIMEOUT
    # The parameter is libpq's own: a URL that carries it opens a real database as before.
    opened = open_store(f"{postgres.new_database()}?connect_timeout=5", ttl_seconds=60.0, max_bytes=10**6)
    opened.put(record(1))
    assert opened.get("resp_0001") is not None
    opened.close()


def test_the_password_never_reaches_reports() -> None:
    assert (
        redacted("postgresql://relay:s3cret@db.example:5433/responses")
        == "postgresql://relay:***@db.example:5433/responses"
    )
    assert redacted("postgresql://relay@db/responses") == "postgresql://relay@db/responses"
    with pytest.raises(StoreError) as raised:
        store("postgresql://nobody:s3cret@127.0.0.1:9/none", connect_timeout=1.0)
    assert "s3cret" not in str(raised.value)


def test_a_dropped_table_fails_each_call_cleanly(postgres: PostgresServer) -> None:
    url = postgres.new_database()
    shared = store(url)
    try:
        shared.put(record(1))
        with psycopg.connect(url, autocommit=True) as db:
            db.execute("DROP TABLE mlx_relay_responses")
        with pytest.raises(StoreError, match="put failed"):
            shared.put(record(2))
        with pytest.raises(StoreError, match="get failed"):
            shared.get(record(1).id)
    finally:
        shared.close()
