"""`POST /v1/models/pull` (SSE), Ollama's `/api/pull` (NDJSON) and `DELETE /api/delete` through a real server,
pulling from the loopback Hub (tests/hub.py) into a Hugging Face cache of the test's own, behind an API key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.hub import Hub

pytestmark = pytest.mark.slow
KEY = "pull-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def hub(tiny_model: Path) -> Iterator[Hub]:
    served = Hub()
    served.add("test/tiny", tiny_model)
    with served.running() as running:
        yield running


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-cache")


@pytest.fixture(scope="module")
def server(server_factory: ServerFactory, hub: Hub, cache: Path) -> Iterator[Server]:
    with pytest.MonkeyPatch.context() as patch:
        # The server's huggingface_hub reads these at its start: the loopback Hub, the test's cache.
        patch.setenv("HF_ENDPOINT", hub.url)
        patch.setenv("HF_HUB_CACHE", str(cache))
        yield server_factory(private=True, api_key=KEY)


def _sse(server: Server, body: dict[str, object]) -> list[object]:
    with loopback.stream("POST", f"{server.v1}/models/pull", json=body, headers=AUTH, timeout=60) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        data = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(item) for item in data[:-1]]


def test_the_pull_routes_need_the_key(server: Server) -> None:
    for method, path in (("POST", "/v1/models/pull"), ("POST", "/api/pull"), ("DELETE", "/api/delete")):
        reply = loopback.request(method, server.base_url + path, json={"model": "test/tiny"}, timeout=30)
        assert reply.status_code == 401, path


def test_sse_pull_streams_progress_into_the_cache(server: Server, hub: Hub, cache: Path) -> None:
    frames = _sse(server, {"model": "test/tiny"})
    statuses = [frame["status"] for frame in frames if isinstance(frame, dict)]
    assert statuses[0] == "manifest" and statuses[1] == "fit" and statuses[-1] == "success"
    assert frames[1]["fits"] is True  # type: ignore[index]
    progress = [frame for frame in frames if isinstance(frame, dict) and frame["status"] == "progress"]
    total = sum(file.size for file in hub.repos["test/tiny"].files.values())
    assert progress[-1]["completed_bytes"] == progress[-1]["total_bytes"] == total
    commit = hub.repos["test/tiny"].commit
    assert (cache / "models--test--tiny" / "refs" / "main").read_text() == commit
    # The server's reports carry no paths of its disk.
    assert str(cache) not in json.dumps(frames)


def test_sse_pull_of_an_unknown_repository_ends_with_an_error_frame(server: Server) -> None:
    frames = _sse(server, {"model": "test/absent"})
    assert frames == [
        {
            "error": {
                "type": "not_found_error",
                "code": "not_found",
                "message": "repository test/absent not found (or it is private or gated: set HF_TOKEN)",
            }
        }
    ]


def test_a_pull_without_a_model_is_a_400_naming_it(server: Server) -> None:
    reply = loopback.post(f"{server.v1}/models/pull", json={}, headers=AUTH, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "model"


def test_ollama_pull_then_delete(server: Server, hub: Hub, cache: Path) -> None:
    body = {"model": "hf.co/test/tiny"}
    with loopback.stream("POST", f"{server.base_url}/api/pull", json=body, headers=AUTH, timeout=60) as reply:
        assert reply.status_code == 200
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert lines[0] == {"status": "pulling manifest"} and lines[-1] == {"status": "success"}
    assert {"status": "verifying sha256 digest"} in lines
    weights = hub.repos["test/tiny"].files["model.safetensors"]
    pulled = [line for line in lines if line.get("digest") == f"sha256:{weights.sha256}"]
    assert pulled[-1] == {
        "status": f"pulling {weights.sha256[:12]}",  # type: ignore[index]
        "digest": f"sha256:{weights.sha256}",
        "total": weights.size,
        "completed": weights.size,
    }
    deleted = loopback.request("DELETE", f"{server.base_url}/api/delete", json={"model": "test/tiny"}, headers=AUTH)
    assert deleted.status_code == 200
    assert not (cache / "models--test--tiny").exists()
    again = loopback.request("DELETE", f"{server.base_url}/api/delete", json={"model": "test/tiny"}, headers=AUTH)
    assert again.status_code == 404 and "not in the Hugging Face cache" in again.json()["error"]


def test_ollama_pull_errors_in_its_own_framing(server: Server) -> None:
    reply = loopback.post(f"{server.base_url}/api/pull", json={"model": "test/absent", "stream": False}, headers=AUTH)
    assert reply.json() == {"error": "repository test/absent not found (or it is private or gated: set HF_TOKEN)"}
    assert reply.status_code == 500
