"""The server's log lines as a person reads them: `--log-format console`, and `auto` on a real terminal.

Each test starts a server of its own settings (the JSON lines of every other server are read by the tests of
workers, zygote and failures, which parse them).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests import loopback
from tests.conftest import REPO, STARTUP_TIMEOUT, ServerFactory, _free_port

pytestmark = pytest.mark.slow
COLOUR = re.compile(r"\x1b\[[0-9;]*m")
CONSOLE_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (?P<level>\w+) +(?P<event>[\w.]+)(?: (?P<rest>.*))?$")
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _eventually(read: Callable[[], str], wanted: str, timeout: float = 10.0) -> str:
    """What `read` gives once it holds `wanted` (a log line is written after its reply has gone)."""
    deadline = time.monotonic() + timeout
    while wanted not in (text := read()):
        assert time.monotonic() < deadline, f"no {wanted!r} in:\n{text}"
        time.sleep(0.05)
    return text


def _console_lines(text: str) -> dict[str, list[str]]:
    """Every line of `text` as a console line, by event; fails on any other line, a JSON one above all."""
    events: dict[str, list[str]] = {}
    for line in filter(None, text.splitlines()):
        match = CONSOLE_LINE.match(line)
        assert match is not None and not line.startswith("{"), f"not a console line: {line!r}"
        events.setdefault(match["event"], []).append(line)
    return events


def _check_a_request_s_lines(events: dict[str, list[str]], trace_id: str) -> None:
    (finish,) = [line for line in events["request.finish"] if f"trace_id={trace_id}" in line]
    assert " info    request.finish request_id=chatcmpl-" in finish and "completion_tokens=2" in finish
    (access,) = [line for line in events["http.access"] if "POST /v1/chat/completions" in line]
    assert re.search(rf"POST /v1/chat/completions 200 \d+B [\d.]+ms trace_id={trace_id} client=127\.0\.0\.1:", access)
    # The model worker's own lines, passed on by the front, are written the same way.
    assert any("worker_pid=" in line for line in events["worker.ready"])


def test_console_lines_for_a_server_and_its_worker(server_factory: ServerFactory) -> None:
    """`--log-format console` (as MLX_RELAY_LOG_FORMAT) on a log file: no JSON, no colour, the access log too."""
    server = server_factory(log_format="console")
    reply = loopback.post(f"{server.v1}/chat/completions", json=CHAT, headers={"x-request-id": "trace-console"})
    assert reply.status_code == 200
    text = _eventually(server.logs, "trace_id=trace-console client=")
    assert "\x1b" not in text
    _check_a_request_s_lines(_console_lines(text), "trace-console")


def test_a_terminal_gets_coloured_console_lines_from_auto() -> None:
    """`mlx-relay serve` in a terminal, as the issue tried it: console lines with colour, the worker's too."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_") and k != "NO_COLOR"}
    command = [sys.executable, "-m", "mlx_relay", "serve", "--port", str(port), "--access-log", "-"]
    master, slave = os.openpty()
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env={**env, "MLX_RELAY_DEMO_MODEL": "tiny"},
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    written = bytearray()

    def read() -> str:
        while select.select([master], [], [], 0.05)[0]:
            try:
                written.extend(os.read(master, 65536))
            except OSError:  # the terminal's other side has closed
                break
        return written.decode(errors="replace").replace("\r\n", "\n")

    try:
        _eventually(read, "server.ready", STARTUP_TIMEOUT)
        reply = loopback.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, headers={"x-request-id": "trace-tty"}
        )
        assert reply.status_code == 200
        text = _eventually(read, "trace_id\x1b[0m=trace-tty")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        os.close(master)
    assert "\x1b[32minfo" in text and "\x1b[32m200\x1b[0m" in text
    _check_a_request_s_lines(_console_lines(COLOUR.sub("", text)), "trace-tty")


def test_a_bad_log_format_is_one_line_naming_it() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_")}
    refused = subprocess.run(
        [sys.executable, "-m", "mlx_relay", "serve", "--log-format", "xml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "MLX_RELAY_LOG_FORMAT='xml' (--log-format) is not one of auto, json, console" in refused.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(refused.stderr)
