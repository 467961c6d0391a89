"""The front's event loop keeps its turn while a model's tokenizer and plan are read in its threads.

Loading a model in the front (its tokenizer, vocabulary scans, the memory
plan) is Python in a worker thread that holds the interpreter lock for
long stretches. Every socket call of the event loop gives the lock up and
must wait for it back, up to the interpreter's switch interval (5 ms):
with a load running, each SSE write of another model's streams can cost a
switch interval, and those streams' token gaps grow. While any load runs,
the interval is cut to `_LOADING_INTERVAL_S`, so the loop waits a fraction
of that; the load itself takes a little longer. A worker process does
the same while it loads its model (`workers/host.py`), so its heartbeats
keep their turn beside its own loading threads.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

_LOADING_INTERVAL_S = 0.0005
_loads = 0
_saved = 0.0


@contextlib.contextmanager
def yielding_gil() -> Iterator[None]:
    """The short switch interval while the block runs (nested and concurrent loads share it)."""
    global _loads, _saved
    if _loads == 0:
        _saved = sys.getswitchinterval()
        sys.setswitchinterval(min(_saved, _LOADING_INTERVAL_S))
    _loads += 1
    try:
        yield
    finally:
        _loads -= 1
        if _loads == 0:
            sys.setswitchinterval(_saved)
