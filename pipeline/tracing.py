"""Request tracing: timestamps carried on messages, and structlog setup.

Stages only stamp a `Timeline`; durations are computed here from the
stamps (docs/STYLE.md, "Tracing"), so every log line about time reads from one clock.
"""

from __future__ import annotations

import enum
import logging
import sys
import time
from collections.abc import Callable

import attrs
import structlog

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


def configure_logging(level: str = "info") -> None:
    """JSON lines when stderr is not a terminal, console output when it is."""
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
