"""edge/server_logs.py: hypercorn's access and error lines follow the log format, through hypercorn's own Logger.

hypercorn makes its loggers' handlers after the app's lifespan has started, so each test restyles first and only
then builds hypercorn's `Logger`, as a server does.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypercorn.config import Config
from hypercorn.logging import Logger

from edge.server_logs import ACCESS_LOGGER, ERROR_LOGGER, restyle_server_logs
from tests.pipeline.test_logs import COLOUR, CONSOLE_LINE, Terminal

# hypercorn's own line, as log shippers and tests/e2e read it: `[time] [pid] [INFO] client - - [time] "request" ...`.
HYPERCORN_ACCESS = re.compile(
    r'^\[[^]]+\] \[\d+\] \[INFO\] 127\.0\.0\.1:5000 - - \[[^]]+\] "POST /v1/chat 1\.1" 200 42 '
)
SCOPE = {
    "type": "http",
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/v1/chat",
    "query_string": b"stream=1",
    "client": ("127.0.0.1", 5000),
    "headers": [(b"user-agent", b"test")],
}
RESPONSE = {"status": 200, "headers": [(b"content-length", b"42"), (b"x-request-id", b"chatcmpl-1")]}


@pytest.fixture(autouse=True)
def fresh_hypercorn_loggers() -> Iterator[None]:
    yield
    restyle_server_logs("json")
    for name in (ACCESS_LOGGER, ERROR_LOGGER):
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            handler.close()
        logger.handlers = []


def _serve_one_request(accesslog: str) -> None:
    config = Config()
    config.accesslog = accesslog
    config.errorlog = accesslog
    logger = Logger(config)
    asyncio.run(logger.access(SCOPE, RESPONSE, 0.0123))  # type: ignore[arg-type]
    asyncio.run(logger.info("Running on http://127.0.0.1:8080 (CTRL + C to quit)"))


def test_console_access_lines_are_short_and_readable(tmp_path: Path) -> None:
    """Forced to a file: the method, path, status, size and time, then the client and the request's trace id."""
    restyle_server_logs("console", {})
    _serve_one_request(str(tmp_path / "access.log"))
    access, server = (tmp_path / "access.log").read_text().splitlines()
    match = CONSOLE_LINE.match(access)
    assert match is not None, access
    assert (match["level"], match["event"]) == ("info", "http.access")
    assert match["rest"] == "POST /v1/chat?stream=1 200 42B 12.3ms trace_id=chatcmpl-1 client=127.0.0.1:5000"
    assert server.endswith("info    http.server Running on http://127.0.0.1:8080 (CTRL + C to quit)")
    assert "\x1b" not in access + server


def test_auto_on_a_terminal_colours_the_access_line(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    try:
        monkeypatch.setattr("sys.stdout", terminal.stream)
        restyle_server_logs("auto", {})
        _serve_one_request("-")
        written = terminal.read()
    finally:
        terminal.close()
    assert "\x1b[32m200" in written  # a success's status in green
    line = COLOUR.sub("", written).splitlines()[0]
    assert CONSOLE_LINE.match(line) is not None and "http.access POST /v1/chat?stream=1 200" in line


@pytest.mark.parametrize("log_format", ["json", "auto"])
def test_json_and_auto_off_a_terminal_leave_hypercorn_s_line_as_it_was(tmp_path: Path, log_format: str) -> None:
    restyle_server_logs(log_format, {})
    _serve_one_request(str(tmp_path / "access.log"))
    access = (tmp_path / "access.log").read_text().splitlines()[0]
    assert HYPERCORN_ACCESS.match(access), access


def test_a_later_choice_replaces_an_earlier_one(tmp_path: Path) -> None:
    restyle_server_logs("console", {})
    restyle_server_logs("json", {})
    _serve_one_request(str(tmp_path / "access.log"))
    assert HYPERCORN_ACCESS.match((tmp_path / "access.log").read_text())


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="'xml'"):
        restyle_server_logs("xml", {})
