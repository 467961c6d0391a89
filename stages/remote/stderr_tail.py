"""A worker's stderr, passed on to the front's and its end kept: what a worker that dies printed last.

A worker that crashes before it can send a frame (an import that fails, a
native crash that `faulthandler` reports) leaves only its stderr to say
why. The worker writes it into a pipe; a thread of the front's reads it,
writes each whole line on to the front's own stderr (so the server's log
is what it was), and keeps the last `_LINES` lines, `_BYTES` bytes at
most, and the last `faulthandler` headline (`Fatal Python error: ...`),
which a native crash's stack dump would push out of the tail. It is a
thread, not a task: the lines are forwarded while the loop is busy, and a
worker's log never waits on the front's loop.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections import deque

# The tail kept: what a crash report's last lines (the exception, the native frames) fit in.
_LINES = 20
_BYTES = 4096
_READ = 65536
# How faulthandler's report of a native crash begins (its frames follow, most recent first).
_FATAL = b"Fatal Python error:"
# A console log line's colours (pipeline/logs.py), left out of the text a reason quotes: a reason is read in JSON
# and in other logs, where they would be noise. The lines passed on keep them.
_COLOURS = re.compile(rb"\x1b\[[0-9;]*m")


class StderrTail:
    """Reads `fd` (the pipe's read end, closed here at its end) until every writer has closed it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lines: deque[bytes] = deque(maxlen=_LINES)
        self._fatal = b""
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="worker-stderr", daemon=True)
        self._thread.start()

    def text(self, max_chars: int = _BYTES) -> str:
        """The last lines, at most about `max_chars` characters (a cut first line loses its start), after the
        crash's headline when they no longer hold it."""
        fatal = self._fatal.decode(errors="replace").strip()
        tail = _COLOURS.sub(b"", b"".join(self._lines)).decode(errors="replace").strip()[-max_chars:]
        # The headline may sit in the kept lines yet before the cut: a deep stack's frames follow it.
        if fatal and fatal not in tail:
            return f"{fatal}\n...\n{tail[-max(0, max_chars - len(fatal)) :]}"
        return tail

    def wait_closed(self, timeout: float) -> bool:
        """Whether the pipe ended (the worker and whatever it started closed it) within `timeout`."""
        return self._closed.wait(timeout)

    def _read(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self._fd, _READ):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                if len(pending) > _READ:
                    # A line with no end in sight is passed on in pieces, never held whole.
                    lines.append(pending)
                    pending = b""
                for line in lines:
                    self._keep(line + b"\n")
            if pending:
                self._keep(pending + b"\n")
        except OSError:
            pass
        finally:
            os.close(self._fd)
            self._closed.set()

    def _keep(self, line: bytes) -> None:
        kept = line[-_BYTES:]
        self._lines.append(kept)
        if kept.startswith(_FATAL):
            self._fatal = kept
        with contextlib.suppress(OSError):
            view = memoryview(line)
            while view:
                view = view[os.write(2, view) :]
