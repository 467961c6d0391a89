"""The loop's thread names its async library to sniffio once, rather than anyio having it sniffed at every call.

anyio asks sniffio which library runs at each call that reaches its backend: a checkpoint, an event, a
channel's wait, a thread hop. sniffio answers "asyncio" by asking asyncio for the current task, which on Python
3.11 also makes a getpid() system call (`bench.front_floor` counts the front's cost per streamed token). Trio
names itself in sniffio's thread-local; asyncio does not, so the front's lifespan and a model worker's main do it
for the loop's thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import sniffio

_named = threading.local()


@contextmanager
def named_async_library() -> Iterator[None]:
    """While the block runs, this thread answers sniffio with the library running now, without sniffing."""
    previous = sniffio.thread_local.name
    sniffio.thread_local.name = sniffio.current_async_library()
    _named.here = True
    try:
        yield
    finally:
        sniffio.thread_local.name = previous
        _named.here = False


def _forget_in_child() -> None:
    # A process forked from the named thread (the front's zygote, and the workers it forks) runs no loop yet: its
    # own `anyio.run` would find one named and refuse to start.
    if getattr(_named, "here", False):
        sniffio.thread_local.name = None
        _named.here = False


os.register_at_fork(after_in_child=_forget_in_child)
