"""The PostgreSQL Responses store through real servers: replicas sharing one database."""

from __future__ import annotations

import psycopg
import pytest

from tests import loopback
from tests.conftest import ServerFactory
from tests.e2e.test_responses import events_of
from tests.pg import PostgresServer

pytestmark = pytest.mark.slow


def test_a_chain_continues_on_whichever_replica_answers(
    server_factory: ServerFactory, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    # Two replicas of one store: the same settings, so each asks for a server of its own.
    replicas = [server_factory(private=True, response_store=url) for _ in range(2)]
    clients = [replica.client() for replica in replicas]
    previous: str | None = None
    inputs = []
    for turn in range(4):
        response = clients[turn % 2].responses.create(
            model="m", input=f"Turn {turn}.", previous_response_id=previous, max_output_tokens=2, temperature=0
        )  # type: ignore[call-overload]
        assert response.usage is not None
        inputs.append(response.usage.input_tokens)
        previous = response.id
    # Each turn replays the whole chain, whichever replica stored the turn before.
    assert inputs == sorted(inputs) and len(set(inputs)) == 4
    assert clients[0].responses.retrieve(previous).id == previous
    stats = loopback.get(f"{replicas[1].base_url}/stats", timeout=10).json()["response_store"]
    assert stats["kind"] == "postgresql" and stats["entries"] == 4


def test_a_store_failure_is_response_failed_and_nothing_is_stored(
    server_factory: ServerFactory, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    server = server_factory(private=True, response_store=url)  # its store is broken below
    server.client().responses.create(model="m", input="warm", max_output_tokens=2)
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("ALTER TABLE mlx_relay_responses RENAME TO gone")
    events = events_of(server, {"model": "m", "input": "Hello", "max_output_tokens": 5})
    assert events[-1]["type"] == "response.failed"
    assert not any(e["type"] in ("response.completed", "response.incomplete") for e in events)
    failed = events[-1]["response"]
    assert isinstance(failed, dict) and failed["error"]["code"] == "server_error"  # type: ignore[index]
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("ALTER TABLE gone RENAME TO mlx_relay_responses")
        (stored,) = db.execute(
            "SELECT COUNT(*) FROM mlx_relay_responses WHERE id = %s", (failed["id"],)
        ).fetchone() or (0,)
    assert stored == 0
    # The store works again once the table is back: the pool recovered.
    again = server.client().responses.create(model="m", input="again", max_output_tokens=2)
    assert server.client().responses.retrieve(again.id).id == again.id


@pytest.mark.parametrize(
    ("hypercorn", "said"), [(True, "server.cannot_start"), (False, "mlx-relay: the response store")]
)
def test_an_unreachable_store_stops_start_up_with_one_line(
    server_factory: ServerFactory, hypercorn: bool, said: str
) -> None:
    with pytest.raises(RuntimeError) as raised:
        server_factory(
            response_store="postgresql://relay:s3cret@127.0.0.1:9/none?connect_timeout=1", hypercorn=hypercorn
        )
    assert said in str(raised.value) and "response store" in str(raised.value)
    assert "s3cret" not in str(raised.value)
