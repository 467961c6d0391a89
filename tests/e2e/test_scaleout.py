"""Replicas behind the routers of deploy/: smg (HTTP mode) and HAProxy, through real processes.

What docs/deploy.md promises about each router: smg polls `/v1/loads` and
routes; it answers `GET /v1/responses/{id}` itself (a 404 for a response a
replica stored) while `previous_response_id` reaches the replicas' shared
store; HAProxy keeps a session key on one replica, from a header or the
body, and passes every path.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest

from deploy.scaleout import Cluster
from tests import loopback

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pytest.importorskip("smg", reason="smg is the scaleout extra: pip install 'mlx-relay[scaleout]'")
    started = Cluster.create(run_dir=tmp_path_factory.mktemp("scaleout"))
    try:
        started.start_replicas(2, env={"MLX_RELAY_DEMO_MODEL": "tiny"})
        yield started
    finally:
        started.stop()


def submitted(cluster: Cluster) -> list[int]:
    return [int(loopback.get(f"{r.url}/stats", timeout=10).json()["submitted"]) for r in cluster.replicas]


def model(cluster: Cluster) -> str:
    return str(loopback.get(f"{cluster.replicas[0].url}/v1/models", timeout=10).json()["data"][0]["id"])


def test_smg_polls_loads_and_previous_ids_reach_the_shared_store(cluster: Cluster) -> None:
    url = cluster.start_smg(policy="cache_aware")
    try:
        body = {"model": model(cluster), "input": "Hello.", "max_output_tokens": 2}
        first = loopback.post(f"{url}/v1/responses", json=body, timeout=60)
        assert first.status_code == 200, first.text
        second = loopback.post(
            f"{url}/v1/responses", json={**body, "previous_response_id": first.json()["id"]}, timeout=60
        )
        assert second.status_code == 200, second.text
        assert second.json()["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]
        # smg answers GET /v1/responses/{id} from its own store: the replica's response is not there.
        assert loopback.get(f"{url}/v1/responses/{first.json()['id']}", timeout=30).status_code == 404
        assert (
            loopback.get(f"{cluster.replicas[0].url}/v1/responses/{first.json()['id']}", timeout=30).status_code == 200
        )
        polled = load_polls(cluster)
        assert polled and all(" 200 " in line for line in polled), polled
    finally:
        cluster.stop_router()


def load_polls(cluster: Cluster, timeout: float = 30.0) -> list[str]:
    """The replicas' access-log lines of smg's `/v1/loads` polls, once there is one.

    smg polls every `--load-monitor-interval` (2 s): two short turns on a fast BLAS end before its
    first poll, so reading the logs at once found none.
    """
    deadline = time.monotonic() + timeout
    while True:
        logs = (replica.log.read_text(errors="replace") for replica in cluster.replicas)
        polled = [line for log in logs for line in log.splitlines() if "/v1/loads" in line]
        if polled or time.monotonic() > deadline:
            return polled
        time.sleep(0.2)


@pytest.mark.skipif(
    shutil.which("haproxy") is None, reason="haproxy is not installed (Debian: apt-get install haproxy)"
)
def test_haproxy_keeps_a_session_on_one_replica(cluster: Cluster) -> None:
    url = cluster.start_haproxy()
    try:
        name = model(cluster)
        for how in ("header", "body"):
            before = submitted(cluster)
            for turn in range(4):
                body: dict[str, object] = {
                    "model": name,
                    "messages": [{"role": "user", "content": f"turn {turn}"}],
                    "max_tokens": 1,
                }
                headers = {"x-session-affinity": "conversation-a"} if how == "header" else {}
                if how == "body":
                    body["prompt_cache_key"] = "conversation-b"
                assert (
                    loopback.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60).status_code
                    == 200
                )
            moved = sorted(after - b for after, b in zip(submitted(cluster), before, strict=True))
            assert moved == [0, 4], how
        created = loopback.post(
            f"{url}/v1/responses", json={"model": name, "input": "Keep.", "max_output_tokens": 1}, timeout=60
        )
        # HAProxy passes every path: any replica answers from the shared store.
        assert loopback.get(f"{url}/v1/responses/{created.json()['id']}", timeout=30).status_code == 200
    finally:
        cluster.stop_router()
