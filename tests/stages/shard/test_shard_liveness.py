"""Heartbeats: a follower counts as alive while its beats arrive, lost when they stop, and no one else speaks for it."""

from __future__ import annotations

import socket
import time

from stages.shard.liveness import INTERVAL, Beating, Heartbeats


def _wait_for(condition: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_beating_follower_is_alive_and_a_stranger_cannot_end_it() -> None:
    heartbeats = Heartbeats(size=2, timeout=30 * INTERVAL, token="4242")
    port = heartbeats.listen("127.0.0.1")
    Beating(rank=1).start("127.0.0.1", port, "4242")
    assert _wait_for(lambda: heartbeats.ranks()[1].steps == 0 and heartbeats.ranks()[1].silent_s < 1.0)
    # Without the token, a connection's lines are not read, and its closing ends nothing.
    with socket.create_connection(("127.0.0.1", port)) as stranger:
        stranger.sendall(b"1 99\n")
    time.sleep(3 * INTERVAL)
    assert heartbeats.lost() == []
    assert heartbeats.ranks()[1].alive


def test_a_follower_whose_connection_closes_is_lost_at_once() -> None:
    heartbeats = Heartbeats(size=2, timeout=60.0, token="7")
    port = heartbeats.listen("127.0.0.1")
    with socket.create_connection(("127.0.0.1", port)) as follower:
        follower.sendall(b"7\n1 3\n")
        assert _wait_for(lambda: heartbeats.ranks()[1].steps == 3)
    assert _wait_for(lambda: heartbeats.lost() == [1])


def test_a_silent_follower_is_lost_after_the_timeout() -> None:
    heartbeats = Heartbeats(size=2, timeout=0.5, token="7")
    port = heartbeats.listen("127.0.0.1")
    with socket.create_connection(("127.0.0.1", port)) as follower:
        follower.sendall(b"7\n1 0\n")
        assert _wait_for(lambda: heartbeats.lost() == [1])
