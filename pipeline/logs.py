"""Log lines for a log shipper or for a person: structlog's setup, and which rendering a stream gets.

In: `MLX_RELAY_LOG_FORMAT` (`auto`, `json`, `console`), the stream written to (a terminal or not) and the
`NO_COLOR` convention. Out: structlog configured to write one line per event to stderr, either the JSON object
log shippers parse (its keys unchanged) or a console line (`console_line`: time, level, event, the request's ids,
then key=value pairs); and the choice made, exported in `RENDERING_VARIABLE`, so a model worker, whose stderr is
a pipe the front passes on (stages/remote/stderr_tail.py), renders as the front does, colour included
(docs/STYLE.md, "Logs").
"""

from __future__ import annotations

import enum
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping

import structlog

LOG_FORMATS = ("auto", "json", "console")
# Set by a process that chose its rendering, read by the processes it starts whose stderr it passes on.
RENDERING_VARIABLE = "MLX_RELAY_LOG_RENDERING"
# Keys a console line puts right after the event, in this order, where they are bound: what a person
# follows a request or a model by.
HEAD_KEYS = ("request_id", "trace_id", "model")
# Keys printed below the line, whole: a traceback is read as Python prints it.
BLOCK_KEYS = ("exception", "stack")

_RESET = "\x1b[0m"
_DIM = "\x1b[2m"
_BOLD = "\x1b[1m"
_LEVEL_COLOURS = {
    "debug": "\x1b[34m",
    "info": "\x1b[32m",
    "warning": "\x1b[33m",
    "error": "\x1b[31m",
    "critical": "\x1b[1;31m",
}
# The widest level name but one ("critical" is rare enough to push its line over by a column).
_LEVEL_WIDTH = 7
_UNQUOTED_NEVER = frozenset(" \"'=\\")


class Rendering(enum.Enum):
    """What one stream gets: JSON lines, or console lines with or without colour."""

    JSON = "json"
    CONSOLE = "console"
    COLOUR = "colour"


def choose_rendering(log_format: str, stream: object, environ: Mapping[str, str]) -> Rendering:
    """`log_format` resolved for `stream`: `auto` is console on a terminal and JSON elsewhere; colour only on a
    terminal and only while `NO_COLOR` is unset or empty (no-color.org).

    Raises:
        ValueError: `log_format` is not one of `LOG_FORMATS`.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    terminal = is_terminal(stream)
    if log_format == "json" or (log_format == "auto" and not terminal):
        return Rendering.JSON
    return Rendering.COLOUR if terminal and not environ.get("NO_COLOR") else Rendering.CONSOLE


def is_terminal(stream: object) -> bool:
    """Whether `stream` writes to a terminal; a closed or fileless stream is not one."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:
        return False


def configure_logging(
    level: str = "info", log_format: str = "auto", *, environ: MutableMapping[str, str] | None = None
) -> Rendering:
    """structlog to stderr, rendered as `log_format` resolves for it; the rendering is also written to
    `environ[RENDERING_VARIABLE]` (`os.environ` by default) for the worker processes started after this call.

    Raises:
        ValueError: an unknown `log_format`; KeyError: an unknown `level`.
    """
    env = os.environ if environ is None else environ
    rendering = choose_rendering(log_format, sys.stderr, env)
    env[RENDERING_VARIABLE] = rendering.value
    apply_rendering(level, rendering)
    return rendering


def configure_child_logging(level: str, log_format: str, environ: Mapping[str, str] | None = None) -> Rendering:
    """A process whose stderr its parent passes on (a model worker): the parent's rendering where it exported one,
    since this stderr is a pipe even when the parent's is a terminal; else `log_format` resolved here."""
    env = os.environ if environ is None else environ
    inherited = env.get(RENDERING_VARIABLE, "")
    known = {rendering.value: rendering for rendering in Rendering}
    rendering = known.get(inherited) or choose_rendering(log_format, sys.stderr, env)
    apply_rendering(level, rendering)
    return rendering


def apply_rendering(level: str, rendering: Rendering) -> None:
    """structlog's processors for `rendering`, writing to `sys.stderr` as it is now, filtered below `level`."""
    last: list[structlog.types.Processor] = (
        [structlog.processors.TimeStamper(fmt="iso", utc=True), structlog.processors.JSONRenderer()]
        if rendering is Rendering.JSON
        else [structlog.processors.TimeStamper(fmt=None), ConsoleLines(colour=rendering is Rendering.COLOUR)]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            *last[:1],
            structlog.processors.format_exc_info,
            last[-1],
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        # One write a line, newline included: print() writes the newline apart, and a worker's lines passed on
        # between the two (stages/remote/stderr_tail.py) would join two events on one line.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


class ConsoleLines:
    """structlog's last processor for a person: an event dict to `console_line`'s text."""

    def __init__(self, *, colour: bool) -> None:
        self.colour = colour

    def __call__(self, _logger: object, _method: str, event_dict: MutableMapping[str, object]) -> str:
        fields = dict(event_dict)
        stamp = fields.pop("timestamp", None)
        level = str(fields.pop("level", "info"))
        event = str(fields.pop("event", ""))
        when = stamp if isinstance(stamp, float) else time.time()
        return console_line(when, level, event, fields, colour=self.colour)


def console_line(
    when: float, level: str, event: str, fields: Mapping[str, object], *, message: str = "", colour: bool = False
) -> str:
    """One event as a person reads it: local time to the millisecond, the level (coloured by severity with
    `colour`), the event name, `message` if any, the `HEAD_KEYS` bound, then every other field as key=value in
    the order bound. A value with spaces, quotes or control characters is JSON-quoted, so the event stays on one
    line; only `BLOCK_KEYS` (a traceback) follow on lines of their own."""
    paint = _painter(colour)
    clock = time.strftime("%H:%M:%S", time.localtime(when)) + f".{int(when % 1 * 1000):03d}"
    parts = [paint(clock, _DIM), paint(f"{level:<{_LEVEL_WIDTH}}", _LEVEL_COLOURS.get(level, "")), paint(event, _BOLD)]
    if message:
        parts.append(message)
    rest = dict(fields)
    blocks = [str(rest.pop(key)) for key in BLOCK_KEYS if key in rest]
    if rest.get("trace_id") == rest.get("request_id"):
        # The usual case: a request's trace is its own id, said once.
        rest.pop("trace_id", None)
    head = [key for key in HEAD_KEYS if key in rest]
    for key in [*head, *(key for key in rest if key not in HEAD_KEYS)]:
        parts.append(f"{paint(key, _DIM)}={quoted(rest[key])}")
    return "\n".join([" ".join(parts), *(block.rstrip("\n") for block in blocks)])


def quoted(value: object) -> str:
    """A field's value for a console line: bare where that is unambiguous, JSON-quoted where not (a string with
    spaces, quotes or `=`, or any control character, which could break the line or restyle the terminal)."""
    text = value if isinstance(value, str) else repr(value)
    if not text.isprintable():
        return json.dumps(text)
    if isinstance(value, str) and (not text or _UNQUOTED_NEVER.intersection(text)):
        return json.dumps(text, ensure_ascii=False)
    # A container's or a number's repr, spaces and all, is read as Python writes it.
    return text


def _painter(colour: bool) -> Callable[[str, str], str]:
    return _ansi if colour else _plain


def _plain(text: str, _code: str) -> str:
    return text


def _ansi(text: str, code: str) -> str:
    return f"{code}{text}{_RESET}" if code else text
