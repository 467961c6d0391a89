"""The Responses API over WebSocket (`GET /v1/responses` upgraded), driven by a real client (`websockets`).

Turns one after another on one connection, continued by `previous_response_id`; the frames are the
HTTP route's SSE `data:` payloads; `generate: false` pre-warms; failures are in-band error frames and
the connection goes on serving; a client that closes mid-turn ends the turn; keys and origins are
checked on the upgrade.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync import client as ws_client
from websockets.sync.client import ClientConnection
from websockets.typing import Origin

from tests import loopback
from tests.conftest import Server, ServerFactory, _free_port
from tests.e2e.conftest import stats
from tests.e2e.raw_clients import wait_for
from tests.e2e.test_shutdown_deadline import GRACE, serving

GOING_AWAY = 1001

pytestmark = pytest.mark.slow

KEY = "sk-socket-test"
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
# Long enough that a turn run to its end is unmistakable in the token count.
LONG = 2000
NOTICE = 30.0


def connect(url: str, **options: Any) -> ClientConnection:
    """A client whose reader keeps reading (no `max_queue`). With websockets' default it stops reading once 16
    frames wait unread, and a test that closes mid-turn without reading would never see the server's close frame:
    its close() waited out the 10 s close_timeout whenever 16 deltas had come in first."""
    return ws_client.connect(url, max_queue=None, **options)


def socket_url(server: Server) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/responses"


@pytest.fixture
def socket(server: Server) -> Iterator[ClientConnection]:
    with connect(socket_url(server), additional_headers={"OpenAI-Beta": "responses_websockets=2026-02-06"}) as ws:
        yield ws


def create(ws: ClientConnection, **body: object) -> None:
    ws.send(json.dumps({"type": "response.create", "model": "tiny", **body}))


def turn(ws: ClientConnection) -> list[dict[str, object]]:
    """The frames of one turn, up to and including its terminal one."""
    frames: list[dict[str, object]] = []
    while not frames or frames[-1]["type"] not in TERMINAL:
        message = ws.recv(timeout=120)
        assert isinstance(message, str), "every frame is text"
        frames.append(json.loads(message))
    return frames


def until_generating(ws: ClientConnection) -> dict[str, object] | None:
    """Read frames until the turn generates its first token (None), or its terminal frame if it ends first.

    Any delta counts: a random model may open a think section (reasoning deltas) or a call. Waiting for
    text alone waited out its 100 s on a turn that had ended, with no frame left to come.
    """
    seen: list[object] = []
    while True:
        try:
            frame = json.loads(ws.recv(timeout=60))
        except TimeoutError:
            raise AssertionError(f"no token and no end within 60 s; the turn's frames so far: {seen}") from None
        if str(frame["type"]).endswith(".delta"):
            return None
        if frame["type"] in TERMINAL:
            return frame  # type: ignore[no-any-return]
        seen.append(frame["type"])


def final(frames: list[dict[str, object]]) -> dict[str, object]:
    response = frames[-1]["response"]
    assert isinstance(response, dict)
    return response


def test_three_turns_continue_by_previous_response_id(server: Server, socket: ClientConnection) -> None:
    create(socket, input="Say something.", max_output_tokens=6, temperature=0)
    first = turn(socket)
    assert [f["type"] for f in first[:2]] == ["response.created", "response.in_progress"]
    assert [f["sequence_number"] for f in first] == list(range(len(first)))
    assert first[-1]["type"] in ("response.completed", "response.incomplete")
    previous = final(first)["id"]
    for _ in range(2):
        create(socket, input="And more.", previous_response_id=previous, max_output_tokens=6, temperature=0)
        frames = turn(socket)
        assert final(frames)["previous_response_id"] == previous
        previous = final(frames)["id"]
    # The store holds the whole conversation: three user inputs and the two answers between them.
    items = loopback.get(f"{server.v1}/responses/{previous}/input_items", params={"order": "asc"}, timeout=10).json()
    roles = [item.get("role") for item in items["data"] if item.get("type", "message") == "message"]
    assert roles.count("user") == 3 and roles.count("assistant") == 2, items


def test_frames_are_the_sse_payloads(server: Server, socket: ClientConnection) -> None:
    # Greedy both ways, so both turns end the same way (a random model may stop before its budget, or not).
    create(socket, input="Hello.", max_output_tokens=4, store=False, temperature=0)
    frames = turn(socket)
    body = {
        "model": "tiny",
        "input": "Hello.",
        "max_output_tokens": 4,
        "store": False,
        "stream": True,
        "temperature": 0,
    }
    with loopback.stream("POST", f"{server.v1}/responses", json=body, timeout=60) as response:
        sse = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    # Same event types in the same order, same keys in each; only ids, times and the random text differ.
    assert [(f["type"], sorted(f)) for f in frames][:2] == [(e["type"], sorted(e)) for e in sse][:2]
    assert frames[-1]["type"] == sse[-1]["type"] and sorted(final(frames)) == sorted(sse[-1]["response"])


def test_generate_false_prewarms_and_the_next_turn_continues_it(socket: ClientConnection) -> None:
    create(socket, input="Remember this.", generate=False)
    warm = turn(socket)
    assert [f["type"] for f in warm] == ["response.created", "response.in_progress", "response.completed"]
    response = final(warm)
    assert response["output"] == [] and isinstance(response["usage"], dict)
    assert response["usage"]["output_tokens"] == 0 and response["usage"]["input_tokens"] > 0
    create(socket, input="Go on.", previous_response_id=response["id"], max_output_tokens=4)
    frames = turn(socket)
    assert final(frames)["previous_response_id"] == response["id"]
    usage = final(frames)["usage"]
    assert isinstance(usage, dict)
    # The pre-warmed conversation is served from the prompt cache.
    assert usage["input_tokens_details"]["cached_tokens"] > 0, usage


@pytest.mark.parametrize(
    "frame",
    [
        b"\x00binary",
        "{not json",
        json.dumps({"type": "session.update"}),
        json.dumps([1, 2]),
        json.dumps({"type": "response.create", "model": "tiny", "input": 5}),
        json.dumps({"type": "response.create", "model": "tiny", "input": "x", "previous_response_id": "resp_unknown"}),
        json.dumps({"type": "response.create", "model": "tiny", "input": "x", "generate": "no"}),
    ],
    ids=["binary", "bad-json", "unknown-type", "not-object", "bad-body", "unknown-previous", "bad-generate"],
)
def test_a_bad_frame_is_an_error_frame_and_the_socket_serves_on(socket: ClientConnection, frame: str | bytes) -> None:
    socket.send(frame)
    error = json.loads(socket.recv(timeout=30))
    assert error["type"] == "error" and error["status"] in (400, 404), error
    assert set(error["error"]) == {"message", "type", "param", "code"}
    create(socket, input="Still there?", max_output_tokens=3)
    assert turn(socket)[-1]["type"] in ("response.completed", "response.incomplete")


def test_oversize_frame_is_refused_in_band(server_factory: ServerFactory) -> None:
    small = server_factory(max_body_bytes="2048")
    with connect(socket_url(small)) as ws:
        create(ws, input="x" * 4096)
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["status"] == 413, error
        create(ws, input="small", max_output_tokens=2)
        assert turn(ws)[-1]["type"] in ("response.completed", "response.incomplete")


def test_a_second_create_while_one_runs_is_refused(socket: ClientConnection) -> None:
    create(socket, input="Talk.", max_output_tokens=200)
    create(socket, input="Me too.", max_output_tokens=2)
    frames = turn(socket)
    errors = [f for f in frames if f["type"] == "error"]
    if not errors:
        # The first turn ended; the refusal of the second comes after it.
        errors = [json.loads(socket.recv(timeout=30))]
    refusal = errors[0]["error"]
    assert isinstance(refusal, dict) and refusal["code"] == "response_in_progress", errors


def test_closing_mid_turn_drops_the_row(server: Server) -> None:
    before = stats(server)
    with connect(socket_url(server)) as ws:
        create(ws, input="Tell me a long story.", max_output_tokens=LONG, store=False, temperature=0)
        assert until_generating(ws) is None, "the turn ended before its first token"
    idle = wait_for(
        server,
        lambda figures: figures["gateway"]["active"] == 0 and figures["sink_rows"] == 0,  # type: ignore[index]
        timeout=NOTICE,
        what="the closed socket's row left the batch",
    )
    generated = idle["gateway"]["generated_tokens"] - before["gateway"]["generated_tokens"]  # type: ignore[index]
    assert generated < LONG / 2, f"the turn ran on after its socket closed: {generated} tokens"


@pytest.fixture(scope="module")
def keyed(server_factory: ServerFactory) -> Server:
    return server_factory(api_key=KEY, cors_origins="https://app.example")


@pytest.mark.parametrize(("headers", "status"), [({}, 401), ({"Authorization": "Bearer wrong"}, 401)])
def test_a_bad_key_refuses_the_upgrade(keyed: Server, headers: dict[str, str], status: int) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(socket_url(keyed), additional_headers=headers).close()
    assert refused.value.response.status_code == status
    assert json.loads(refused.value.response.body)["error"]["code"] in ("missing_api_key", "invalid_api_key")


def test_a_foreign_origin_is_refused(keyed: Server) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(InvalidStatus) as refused:
        connect(socket_url(keyed), additional_headers=headers, origin=Origin("https://evil.example")).close()
    assert refused.value.response.status_code == 403
    with connect(socket_url(keyed), additional_headers=headers, origin=Origin("https://app.example")) as ws:
        create(ws, input="Hi.", max_output_tokens=2)
        assert turn(ws)[-1]["type"] in ("response.completed", "response.incomplete")


def test_shutdown_ends_the_turn_and_closes_before_http_drains(tmp_path: Path) -> None:
    port = _free_port()
    with serving(port, tmp_path / "store.db") as process:
        with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            create(ws, input="Go on and on.", max_output_tokens=LONG, store=False, temperature=0)
            assert until_generating(ws) is None, "the turn ended before its first token"
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            frames = turn(ws)
            assert frames[-1]["type"] == "response.failed", frames[-1]
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
            # Closed at the signal, not at the end of HTTP's graceful timeout.
            assert time.monotonic() - signalled < GRACE
            assert ws.close_code == GOING_AWAY
        assert process.wait(timeout=60) == 0


def test_an_idle_socket_is_closed_normally(server_factory: ServerFactory) -> None:
    brief = server_factory(socket_idle_timeout="1")
    with connect(socket_url(brief)) as ws:
        create(ws, input="Hi.", max_output_tokens=3)
        assert turn(ws)[-1]["type"] in ("response.completed", "response.incomplete")
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
        assert ws.close_code == 1000


SESSIONS = 32


def test_many_sessions_half_leaving_mid_turn_leave_nothing_running(server: Server) -> None:
    def session(index: int) -> str:
        with connect(socket_url(server)) as ws:
            previous = None
            for number in range(3):
                leaving = index % 2 == 1 and number == 2
                # The tiny model's window is 2048 tokens: room for the history and a long answer.
                tokens = 1500 if leaving else 4
                create(ws, input=f"Turn {number}.", previous_response_id=previous, max_output_tokens=tokens)
                if leaving:
                    # A turn that ends before its first token (an EOS drawn at once) was not left mid-turn: ask again.
                    for _ in range(3):
                        ended = until_generating(ws)
                        if ended is None:
                            return "left"
                        if ended["type"] not in ("response.completed", "response.incomplete"):
                            return f"failed: {ended}"
                        create(ws, input=f"Turn {number}.", previous_response_id=previous, max_output_tokens=tokens)
                    return "every turn ended before its first token"
                previous = final(turn(ws))["id"]
        return "done"

    with ThreadPoolExecutor(SESSIONS) as pool:
        ends = list(pool.map(session, range(SESSIONS)))
    assert sorted(ends) == sorted(["left", "done"] * (SESSIONS // 2)), ends
    wait_for(
        server,
        lambda figures: figures["gateway"]["active"] == figures["admission"]["in_flight"] == 0,  # type: ignore[index]
        timeout=NOTICE,
        what="every session's row left",
    )


def test_a_plain_get_is_told_to_upgrade(server: Server) -> None:
    response = loopback.get(f"{server.v1}/responses", timeout=10)
    assert response.status_code == 426 and response.headers["upgrade"].lower() == "websocket"
    assert response.json()["error"]["type"] == "invalid_request_error"
