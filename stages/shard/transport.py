"""Rank 0's step message to every other rank, over the group's own collectives.

A message is JSON bytes, broadcast as an `all_sum` of a byte buffer that
only rank 0 fills (the others add zeros). The first buffer is a fixed
frame holding the length and the message's start, so a step that only
says "next" costs one collective; a longer one (a new row's prompt) costs
a second, sized from the header. The collectives run on the generator's
stream, after the work already queued there (the last step's forward
pass and its own collectives), so every rank issues its collectives in
the same order.

A collective waits by polling (the ring backend spins on its sockets), so
a follower waiting in one for rank 0's next step burned most of a core
while the server was idle. The message is therefore preceded by a
doorbell beside the collectives (`stages/shard/liveness.py`: one byte on
each follower's heartbeat connection, which it waits on in the kernel):
rank 0 rings before each message, a follower waits for the ring before
it enters the collective, so an idle follower sleeps. Every message
rings once, so rings and messages pair up.

`agree` is the one collective where every rank speaks: each says yes or
no (a disk file read), and every rank learns the same answer, whether all
said yes, so every rank takes the same branch after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

FRAME = 4096
_HEADER = 8


class Broadcast:
    """One message per call: rank 0 sends, every other rank receives the same bytes."""

    def __init__(self, group: mx.distributed.Group, stream: Any, doorbell: Callable[[], None] | None = None) -> None:
        self._group, self._stream = group, stream
        self.rank = group.rank()
        # Rank 0: ring every follower; a follower: wait for the ring (None: go straight into the collective).
        self._doorbell = doorbell
        # Seconds spent in the collectives, and how many: bench/ reads them.
        self.seconds = 0.0
        self.calls = 0

    def send(self, message: dict[str, Any]) -> None:
        if self.rank != 0:
            raise RuntimeError("only rank 0 sends")
        payload = json.dumps(message, separators=(",", ":")).encode()
        head = np.zeros(FRAME, dtype=np.uint8)
        head[:_HEADER] = np.frombuffer(len(payload).to_bytes(_HEADER, "little"), dtype=np.uint8)
        first = payload[: FRAME - _HEADER]
        head[_HEADER : _HEADER + len(first)] = np.frombuffer(first, dtype=np.uint8)
        if self._doorbell is not None:
            self._doorbell()
        self._sum(head)
        rest = payload[len(first) :]
        if rest:
            self._sum(np.frombuffer(rest, dtype=np.uint8).copy())

    def receive(self) -> dict[str, Any]:
        if self._doorbell is not None:
            self._doorbell()
        head = self._sum(np.zeros(FRAME, dtype=np.uint8))
        length = int.from_bytes(head[:_HEADER].tobytes(), "little")
        payload = head[_HEADER : _HEADER + min(length, FRAME - _HEADER)].tobytes()
        if length > FRAME - _HEADER:
            payload += self._sum(np.zeros(length - (FRAME - _HEADER), dtype=np.uint8)).tobytes()
        message: dict[str, Any] = json.loads(payload)
        return message

    @property
    def stream(self) -> Any:
        """The stream the group's collectives run on: model work outside the generator runs there too."""
        return self._stream

    def agree(self, ok: bool) -> bool:
        """Whether every rank said `ok`; every rank gets the same answer."""
        votes = np.zeros(int(self._group.size()), dtype=np.uint8)
        votes[self.rank] = 1 if ok else 0
        return bool(self._sum(votes).all())

    def _sum(self, buffer: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        total = mx.distributed.all_sum(mx.array(buffer), group=self._group, stream=self._stream)
        mx.eval(total)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return np.array(total, copy=False)
