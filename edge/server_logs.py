"""hypercorn's own logs (its access log, and its error log's lines such as "Running on ...") as console lines.

In: the `MLX_RELAY_LOG_FORMAT` choice. Out: where a handler of hypercorn's `hypercorn.access` or `hypercorn.error`
logger writes to a stream that choice renders as console (pipeline/logs.py's `choose_rendering`, asked of that
handler's own stream: the access log may go to stdout or a file), its lines become console lines: the access log's a
short `METHOD path status size duration` line with the client and the request's trace id. Elsewhere hypercorn's
lines stay exactly as they are (`json`, and `auto` off a terminal): what log shippers already parse.

hypercorn makes its loggers' handlers lazily, once the app's lifespan has started and under either launcher
(`mlx-relay serve`, `hypercorn app:app`), and replaces any it finds; so the restyling is a filter on each logger,
which sees every record before its handlers do, and gives a handler its console formatter the first time.
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from collections.abc import Mapping

from pipeline.logs import LOG_FORMATS, Rendering, choose_rendering, configure_logging, console_line

ACCESS_LOGGER = "hypercorn.access"
ERROR_LOGGER = "hypercorn.error"
# What a person reads hypercorn's own lines by, as events are named (docs/STYLE.md, "Logs").
ACCESS_EVENT = "http.access"
SERVER_EVENT = "http.server"
_STATUS_COLOURS = {"2": "\x1b[32m", "3": "\x1b[36m", "4": "\x1b[33m", "5": "\x1b[31m"}


def configure_server_logs(level: str, log_format: str) -> None:
    """The HTTP process's logs: structlog's (pipeline/logs.py) and hypercorn's, both as `log_format` resolves.

    Called before the zygote forks and any worker starts: they take the rendering chosen here from the environment.

    Raises:
        ValueError: an unknown `log_format`; KeyError: an unknown `level`.
    """
    configure_logging(level, log_format)
    restyle_server_logs(log_format)


def restyle_server_logs(log_format: str, environ: Mapping[str, str] | None = None) -> None:
    """From now on, hypercorn's log lines follow `log_format` (replacing what an earlier call set).

    Raises:
        ValueError: `log_format` is not one of pipeline/logs.py's `LOG_FORMATS`.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    env = dict(os.environ if environ is None else environ)
    for name, event in ((ACCESS_LOGGER, ACCESS_EVENT), (ERROR_LOGGER, SERVER_EVENT)):
        logger = logging.getLogger(name)
        for old in [each for each in logger.filters if isinstance(each, _Restyle)]:
            logger.removeFilter(old)
            old.undo(logger)
        logger.addFilter(_Restyle(log_format, env, event))


class ConsoleRecords(logging.Formatter):
    """A hypercorn record as a console line (pipeline/logs.py's `console_line`)."""

    def __init__(self, *, event: str, colour: bool) -> None:
        super().__init__()
        self.event = event
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        atoms = record.args if record.name == ACCESS_LOGGER and isinstance(record.args, Mapping) else None
        fields: dict[str, object] = {}
        if atoms is not None:
            message, fields = self._access(atoms)
        else:
            message = record.getMessage()
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        level = record.levelname.lower()
        return console_line(record.created, level, self.event, fields, message=message, colour=self.colour)

    def _access(self, atoms: Mapping[str, object]) -> tuple[str, dict[str, object]]:
        """hypercorn's access-log atoms (hypercorn.logging.AccessLogAtoms) as a short line and its fields."""
        status = str(atoms.get("s", "-"))
        size = atoms.get("b", "-")
        millis = float(str(atoms.get("D", 0))) / 1000
        shown = f"{_STATUS_COLOURS.get(status[:1], '')}{status}\x1b[0m" if self.colour else status
        # The path is the client's: quoted where it holds spaces or control characters.
        message = f"{_word(atoms.get('m', '-'))} {_word(atoms.get('Uq', '-'))} {shown} {size}B {millis:.1f}ms"
        fields: dict[str, object] = {"client": atoms.get("h", "-")}
        trace_id = atoms.get("{x-request-id}o", "-")
        if trace_id != "-":
            fields["trace_id"] = trace_id
        return message, fields


def _word(value: object) -> str:
    """A word of the access line's message: bare unless a space or a control character would mislead."""
    text = str(value)
    return text if text.isprintable() and " " not in text and '"' not in text else json.dumps(text)


class _Restyle(logging.Filter):
    """On a hypercorn logger: each handler gets the formatter its stream's rendering asks for, once."""

    def __init__(self, log_format: str, environ: Mapping[str, str], event: str) -> None:
        super().__init__()
        self.log_format = log_format
        self.environ = environ
        self.event = event
        self.seen: weakref.WeakSet[logging.Handler] = weakref.WeakSet()
        self.replaced: weakref.WeakKeyDictionary[logging.Handler, logging.Formatter | None] = (
            weakref.WeakKeyDictionary()
        )

    def filter(self, record: logging.LogRecord) -> bool:
        for handler in logging.getLogger(record.name).handlers:
            if handler not in self.seen:
                self.seen.add(handler)
                self._style(handler)
        return True

    def _style(self, handler: logging.Handler) -> None:
        rendering = choose_rendering(self.log_format, getattr(handler, "stream", None), self.environ)
        if rendering is Rendering.JSON:
            return
        self.replaced[handler] = handler.formatter
        handler.setFormatter(ConsoleRecords(event=self.event, colour=rendering is Rendering.COLOUR))

    def undo(self, logger: logging.Logger) -> None:
        """Give the handlers it restyled their formatters back."""
        for handler in logger.handlers:
            if handler in self.replaced:
                handler.setFormatter(self.replaced[handler])
