"""Heartbeats from every follower to rank 0, beside the collectives.

A collective waits for every rank, for ever: a follower that hangs would
hang rank 0's model thread with it, and one that dies is noticed only at
the next collective. So each follower keeps a TCP connection to rank 0
and writes a line (its rank and step count) every `INTERVAL` seconds from
a thread of its own. Rank 0 counts a follower lost when its connection
closes or its line is `timeout` seconds late; the engine then fails its
requests and aborts the group (`cluster.abort`). The listener is on
every interface, so a connection counts only once its first line is the
token rank 0 handed the followers in the group's first collective: no
one else can speak for a rank, or end one.

The same connection carries rank 0's doorbell the other way: one byte
before each step message (`transport.Broadcast`), which a follower waits
for in a blocking read before it enters the collective. A collective
polls while it waits; a read sleeps, so an idle follower costs no CPU.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import attrs
import structlog

log = structlog.get_logger(stage="shard")

INTERVAL = 0.5


@attrs.frozen(kw_only=True)
class RankStatus:
    rank: int
    alive: bool
    # Seconds since its last heartbeat (0 for rank 0, which is this process).
    silent_s: float
    steps: int


@attrs.define
class _Seen:
    at: float
    steps: int = 0
    closed: bool = False


@attrs.define
class Heartbeats:
    """Rank 0's listener: one thread accepting, one reading each follower."""

    size: int
    timeout: float
    token: str
    _server: socket.socket = attrs.field(init=False)
    _seen: dict[int, _Seen] = attrs.field(factory=dict, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _started: float = attrs.field(factory=time.monotonic, init=False)
    # Each follower's connection, once it has said which rank it is: the doorbell rings on these.
    _bells: dict[int, socket.socket] = attrs.field(factory=dict, init=False)
    _all_joined: threading.Event = attrs.field(factory=threading.Event, init=False)

    def listen(self, host: str = "0.0.0.0") -> int:
        self._server = socket.create_server((host, 0))
        threading.Thread(target=self._accept, name="shard-heartbeats", daemon=True).start()
        port: int = self._server.getsockname()[1]
        return port

    def ranks(self, steps: int = 0) -> list[RankStatus]:
        now = time.monotonic()
        statuses = [RankStatus(rank=0, alive=True, silent_s=0.0, steps=steps)]
        with self._lock:
            for rank in range(1, self.size):
                seen = self._seen.get(rank, _Seen(at=self._started))
                silent = now - seen.at
                alive = not seen.closed and silent < self.timeout
                statuses.append(RankStatus(rank=rank, alive=alive, silent_s=round(silent, 3), steps=seen.steps))
        return statuses

    def lost(self) -> list[int]:
        return [status.rank for status in self.ranks() if not status.alive]

    def ring(self) -> None:
        """Wake every follower for the message about to go; never blocks on a follower that stopped reading."""
        # The first message may come before a follower's connection has said its rank: a ring lost
        # then would leave that follower waiting for ever. One that never says it is lost (the watch's
        # business), and is waited for once only.
        if not self._all_joined.is_set():
            self._all_joined.wait(self.timeout)
            self._all_joined.set()
        with self._lock:
            bells = list(self._bells.values())
        for connection in bells:
            # A follower that is gone or hung is the heartbeats' to notice, not the model thread's to wait on.
            with contextlib.suppress(OSError):
                connection.send(b"\x01", socket.MSG_DONTWAIT)

    def _accept(self) -> None:
        while True:
            connection, _ = self._server.accept()
            threading.Thread(target=self._read, args=(connection,), name="shard-heartbeat", daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        rank = None
        with connection, connection.makefile("r") as lines:
            try:
                if lines.readline().strip() != self.token:
                    return
                for line in lines:
                    rank_text, steps = line.split()
                    rank = int(rank_text)
                    with self._lock:
                        self._seen[rank] = _Seen(at=time.monotonic(), steps=int(steps))
                        if rank not in self._bells:
                            self._bells[rank] = connection
                            if len(self._bells) == self.size - 1:
                                self._all_joined.set()
            except (OSError, ValueError):
                pass
        if rank is not None:
            with self._lock:
                self._seen[rank].closed = True
            log.warning("shard.follower_disconnected", rank=rank)


@attrs.define
class Beating:
    """A follower's heartbeat thread; the process ends if rank 0 goes away."""

    rank: int
    steps: int = 0
    _connection: socket.socket | None = attrs.field(default=None, init=False)

    def start(self, host: str, port: int, token: str) -> None:
        connection = socket.create_connection((host, port), timeout=30)
        connection.settimeout(None)
        connection.sendall(f"{token}\n".encode())
        self._connection = connection
        threading.Thread(target=self._beat, args=(connection,), name="shard-heartbeat", daemon=True).start()

    def wait_for_ring(self) -> None:
        """Sleep until rank 0 rings for its next message (`Heartbeats.ring`)."""
        assert self._connection is not None, "start() first"
        try:
            rang = self._connection.recv(1)
        except OSError:
            rang = b""
        if not rang:
            log.error("shard.rank0_lost", rank=self.rank)
            os._exit(1)

    def _beat(self, connection: socket.socket) -> None:
        try:
            while True:
                connection.sendall(f"{self.rank} {self.steps}\n".encode())
                time.sleep(INTERVAL)
        except OSError:
            # Rank 0 is gone: nothing will send this rank another step.
            log.error("shard.rank0_lost", rank=self.rank)
            os._exit(1)
