"""Request tracing: timestamps carried on messages (structlog's setup is pipeline/logs.py).

Stages only stamp a `Timeline`; durations are computed here from the
stamps (docs/STYLE.md, "Tracing"), so every log line about time reads from one clock.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

import attrs

Clock = Callable[[], float]


class Mark(enum.Enum):
    RECEIVED = "received"
    PARSED = "parsed"
    PREPARED = "prepared"
    ADMITTED = "admitted"
    FIRST_TOKEN = "first_token"
    FINISHED = "finished"


@attrs.frozen
class Timeline:
    stamps: tuple[tuple[Mark, float], ...] = ()

    @classmethod
    def start(cls, clock: Clock = time.monotonic) -> Timeline:
        return cls(((Mark.RECEIVED, clock()),))

    def stamp(self, mark: Mark, at: float | None = None) -> Timeline:
        return Timeline((*self.stamps, (mark, time.monotonic() if at is None else at)))

    def at(self, mark: Mark) -> float | None:
        for stamped, when in self.stamps:
            if stamped is mark:
                return when
        return None

    def between(self, start: Mark, end: Mark) -> float | None:
        """Seconds from `start` to `end`, rounded for logs; None if either is missing."""
        begin, finish = self.at(start), self.at(end)
        if begin is None or finish is None:
            return None
        return round(finish - begin, 6)
