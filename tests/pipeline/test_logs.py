"""pipeline/logs.py: JSON lines for log shippers, console lines for a person, chosen per stream (docs/STYLE.md, "Logs").

A terminal here is a real one: a pseudo-terminal from `os.openpty`, as a shell gives a server.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import sys
from collections.abc import Iterator

import pytest
import structlog

from pipeline.env_values import SettingsError
from pipeline.logs import (
    RENDERING_VARIABLE,
    Rendering,
    choose_rendering,
    configure_child_logging,
    configure_logging,
    console_line,
)
from pipeline.settings import Settings

# A console line: local time to the millisecond, the level padded, the event.
CONSOLE_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (?P<level>\w+) +(?P<event>[\w.]+)(?: (?P<rest>.*))?$")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class Terminal:
    """A pseudo-terminal: `stream` writes to its slave side, `read` what reached its master side."""

    def __init__(self) -> None:
        self.master, slave = os.openpty()
        self.stream = open(slave, "w", buffering=1)  # noqa: SIM115 - closed by close()

    def read(self) -> str:
        chunks = []
        while select.select([self.master], [], [], 0.2)[0]:
            chunks.append(os.read(self.master, 65536))
        # The terminal's line discipline writes each newline as CR LF.
        return b"".join(chunks).decode().replace("\r\n", "\n")

    def close(self) -> None:
        self.stream.close()
        os.close(self.master)


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    opened = Terminal()
    yield opened
    opened.close()


@pytest.fixture
def pipe() -> Iterator[io.TextIOWrapper]:
    read_end, write_end = os.pipe()
    os.close(read_end)
    with open(write_end, "w") as stream:
        yield stream


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.mark.parametrize(
    ("log_format", "on_terminal", "environ", "expected"),
    [
        pytest.param("auto", True, {}, Rendering.COLOUR, id="auto-terminal"),
        pytest.param("auto", False, {}, Rendering.JSON, id="auto-pipe"),
        pytest.param("auto", True, {"NO_COLOR": "1"}, Rendering.CONSOLE, id="auto-terminal-no-color"),
        pytest.param("auto", True, {"NO_COLOR": ""}, Rendering.COLOUR, id="auto-terminal-empty-no-color"),
        pytest.param("json", True, {}, Rendering.JSON, id="json-terminal"),
        pytest.param("console", False, {}, Rendering.CONSOLE, id="console-pipe"),
        pytest.param("console", True, {}, Rendering.COLOUR, id="console-terminal"),
    ],
)
def test_the_rendering_follows_the_format_the_stream_and_no_color(
    terminal: Terminal,
    pipe: io.TextIOWrapper,
    log_format: str,
    on_terminal: bool,
    environ: dict[str, str],
    expected: Rendering,
) -> None:
    """auto: console on a terminal, JSON off one; a named format wins; colour only on a terminal without NO_COLOR."""
    assert choose_rendering(log_format, terminal.stream if on_terminal else pipe, environ) is expected


def test_an_unknown_format_is_refused_by_name(pipe: io.TextIOWrapper) -> None:
    with pytest.raises(ValueError, match="'xml' is not one of auto, json, console"):
        choose_rendering("xml", pipe, {})


def _log_request(level: str = "info") -> None:
    log = structlog.get_logger(stage="sink")
    log.debug("hidden.below_level")
    getattr(log, level)("request.finish", request_id="r1", model="tiny", completion_tokens=3)


def test_json_lines_are_as_log_shippers_read_them(monkeypatch: pytest.MonkeyPatch, terminal: Terminal) -> None:
    """`json`, even on a terminal: one object a line, with exactly the keys it always had."""
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    environ: dict[str, str] = {}
    assert configure_logging("info", "json", environ=environ) is Rendering.JSON
    _log_request()
    (line,) = terminal.read().splitlines()
    entry = json.loads(line)
    assert set(entry) == {"stage", "request_id", "model", "completion_tokens", "event", "level", "timestamp"}
    assert (entry["event"], entry["level"], entry["request_id"], entry["completion_tokens"]) == (
        "request.finish",
        "info",
        "r1",
        3,
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", entry["timestamp"])
    assert environ == {RENDERING_VARIABLE: "json"}


def test_a_terminal_gets_one_coloured_console_line_per_event(
    monkeypatch: pytest.MonkeyPatch, terminal: Terminal
) -> None:
    """auto on a terminal: time, the level in colour, the event, the request id and model first, then the rest."""
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    environ: dict[str, str] = {}
    assert configure_logging("info", "auto", environ=environ) is Rendering.COLOUR
    _log_request("warning")
    written = terminal.read()
    assert "\x1b[33mwarning" in written  # the level's colour: yellow for a warning
    (line,) = COLOUR.sub("", written).splitlines()
    match = CONSOLE_LINE.match(line)
    assert match is not None, line
    assert (match["level"], match["event"]) == ("warning", "request.finish")
    assert match["rest"] == "request_id=r1 model=tiny stage=sink completion_tokens=3"
    assert environ == {RENDERING_VARIABLE: "colour"}


def test_no_color_keeps_a_terminal_s_lines_plain(monkeypatch: pytest.MonkeyPatch, terminal: Terminal) -> None:
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    assert configure_logging("info", "auto", environ={"NO_COLOR": "1"}) is Rendering.CONSOLE
    _log_request()
    written = terminal.read()
    assert "\x1b" not in written
    assert "info    request.finish request_id=r1 model=tiny" in written


def test_console_forced_on_a_pipe_has_no_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert configure_logging("info", "console", environ={}) is Rendering.CONSOLE
    _log_request()
    (line,) = stderr.getvalue().splitlines()
    assert "\x1b" not in line and CONSOLE_LINE.match(line) is not None


def test_an_exception_is_printed_as_python_prints_it(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    configure_logging("info", "console", environ={})
    try:
        raise ValueError("no model here")
    except ValueError:
        structlog.get_logger().exception("engine.crashed", model="tiny")
    first, *traceback = stderr.getvalue().splitlines()
    assert first.endswith("error   engine.crashed model=tiny")
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[-1] == "ValueError: no model here"


def test_a_child_writes_as_its_parent_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's stderr is a pipe; it renders as the front's terminal asked, told through the environment."""
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert configure_child_logging("info", "auto", {RENDERING_VARIABLE: "colour"}) is Rendering.COLOUR
    _log_request()
    assert "\x1b[32minfo" in stderr.getvalue()
    # With nothing inherited, a child decides for its own stream, as any process does.
    assert configure_child_logging("info", "auto", {}) is Rendering.JSON


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        pytest.param({"request_id": "r1", "trace_id": "r1"}, "request_id=r1", id="trace-same-as-request"),
        pytest.param({"trace_id": "t9", "request_id": "r1"}, "request_id=r1 trace_id=t9", id="trace-of-its-own"),
        pytest.param({"reason": "no model\nhere"}, 'reason="no model\\nhere"', id="a-line-break-stays-quoted"),
        pytest.param({"path": "/x\x1b[31m"}, 'path="/x\\u001b[31m"', id="control-characters-escaped"),
        pytest.param({"models": ["a", "b"], "spare": False}, "models=['a', 'b'] spare=False", id="python-values"),
        pytest.param({"model": "a b", "empty": ""}, 'model="a b" empty=""', id="spaces-quoted"),
    ],
)
def test_a_console_line_shows_each_field_once_on_one_line(fields: dict[str, object], shown: str) -> None:
    line = console_line(0.0, "info", "request.finish", fields)
    assert "\n" not in line and "\x1b" not in line
    match = CONSOLE_LINE.match(line)
    assert match is not None and match["rest"] == shown


def test_a_bad_log_format_setting_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"MLX_RELAY_LOG_FORMAT": "xml"})
    message = str(refused.value)
    assert "\n" not in message and "MLX_RELAY_LOG_FORMAT='xml'" in message and "auto, json, console" in message
    assert Settings.from_env({"MLX_RELAY_LOG_FORMAT": "Console"}).log_format == "console"


def test_the_rendering_variable_is_no_unknown_setting() -> None:
    """A server started from a process that configured its logs inherits the variable; it must still start."""
    assert Settings.from_env({RENDERING_VARIABLE: "json"}).log_format == "auto"
