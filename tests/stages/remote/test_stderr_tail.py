"""stages/remote/stderr_tail.py: a worker's stderr goes on to the front's, and its end is kept, bounded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.logs import RENDERING_VARIABLE, Rendering
from stages.remote.stderr_tail import StderrTail


def tail_of(script: str, capfd: pytest.CaptureFixture[str]) -> tuple[StderrTail, str]:
    """What a real child process's stderr leaves in the tail, and what was passed on to this process's stderr."""
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-c", script], stderr=write_end)
    finally:
        os.close(write_end)
    tail = StderrTail(read_end)
    assert child.wait(60) != 0
    assert tail.wait_closed(10)
    return tail, capfd.readouterr().err


def test_the_last_lines_are_kept_and_every_line_is_passed_on(capfd: pytest.CaptureFixture[str]) -> None:
    script = "import sys\nfor i in range(1000): print(f'line {i}', file=sys.stderr)\nraise ValueError('no model here')"
    tail, passed_on = tail_of(script, capfd)
    assert passed_on.splitlines()[:1000] == [f"line {i}" for i in range(1000)]
    assert "ValueError: no model here" in passed_on
    text = tail.text()
    assert text.endswith("ValueError: no model here") and "line 999" in text and "line 100\n" not in text
    assert len(tail.text(40)) == 40


def test_a_native_crash_keeps_faulthandler_s_headline(capfd: pytest.CaptureFixture[str]) -> None:
    """A crash's stack dump is longer than the tail; the headline that names the crash stays in front of it."""
    nested = "def deep(n):\n    return deep(n - 1) if n else os.kill(os.getpid(), signal.SIGSEGV)\n"
    script = f"import faulthandler, os, signal\nfaulthandler.enable()\n{nested}deep(60)"
    tail, passed_on = tail_of(script, capfd)
    assert passed_on.startswith("Fatal Python error: Segmentation fault")
    text = tail.text(1000)
    assert text.startswith("Fatal Python error: Segmentation fault\n...\n") and "in deep" in text
    assert len(text) <= 1000 + len("\n...\n")


def test_an_endless_line_is_held_in_pieces(capfd: pytest.CaptureFixture[str]) -> None:
    tail, passed_on = tail_of("import sys\nsys.stderr.write('x' * 1_000_000)\nsys.exit(3)", capfd)
    assert passed_on.count("x") == 1_000_000
    # Passed on in pieces of at most a read's length; the tail holds the last 4 KiB of them.
    assert len(tail.text()) == 4096 and set(tail.text()) == {"x", "\n"}


def test_the_headline_stays_when_it_is_kept_but_before_the_cut(capfd: pytest.CaptureFixture[str]) -> None:
    """A short stack (within the kept lines) of long frames: the reason's cut would start after the headline."""
    frame = "  File " + "/deep/import/path" * 8 + ", line 1 in <module>"
    script = (
        "import sys\nprint('Fatal Python error: Segmentation fault', file=sys.stderr)\n"
        f"for _ in range(10): print({frame!r}, file=sys.stderr)\nsys.exit(1)"
    )
    tail, _ = tail_of(script, capfd)
    text = tail.text(1000)
    assert text.startswith("Fatal Python error: Segmentation fault\n...\n") and text.endswith("in <module>")


def test_a_coloured_console_line_is_passed_on_coloured_and_quoted_plain(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker writing console lines for the front's terminal (pipeline/logs.py): the terminal gets the colours,
    the reason that quotes its last words gets the text alone."""
    monkeypatch.setenv(RENDERING_VARIABLE, Rendering.COLOUR.value)
    script = (
        "import structlog\nfrom pipeline.logs import configure_child_logging\n"
        "configure_child_logging('info', 'auto')\n"
        "structlog.get_logger().error('worker.cannot_load', model='tiny')\nraise SystemExit(3)"
    )
    tail, passed_on = tail_of(script, capfd)
    assert "\x1b[31merror" in passed_on
    assert "\x1b" not in tail.text() and tail.text().endswith("error   worker.cannot_load model=tiny")
