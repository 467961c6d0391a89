"""Giving freed memory back to the OS: the C heap's trim, on a clock.

MLX's CPU allocator takes its buffers from malloc. Prompt-cache entries
and batch caches are megabytes each and die in any order, and glibc keeps
the pages of freed chunks that sit below live ones (and raises its mmap
threshold after each large free, so later large buffers land in the heap
too): resident memory then creeps up while the live bytes stay level.
`malloc_trim(0)` returns every free page of every arena. It costs about a
millisecond per hundred megabytes of heap (and pages given back fault in
again when reused), so the gateway calls it when the batch goes idle and
at most every `interval` seconds while it runs.
A no-op where the C library has no `malloc_trim` (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

import attrs

_INTERVAL = 10.0


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    function = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if function is None:
        return None
    function.argtypes, function.restype = [ctypes.c_size_t], ctypes.c_int
    trim: Callable[[int], int] = function
    return trim


@attrs.define
class HeapTrimmer:
    """Calls `malloc_trim` when asked, no more often than every `interval` seconds."""

    interval: float = _INTERVAL
    clock: Callable[[], float] = time.monotonic
    _trim: Callable[[int], int] | None = attrs.field(factory=_load_trim, init=False)
    _last: float = attrs.field(default=float("-inf"), init=False)
    trims: int = attrs.field(default=0, init=False)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe(self, *, force: bool = False) -> bool:
        """Trim now if forced or the last trim was `interval` seconds ago or more; True if it trimmed."""
        now = self.clock()
        if self._trim is None or (not force and now - self._last < self.interval):
            return False
        self._last = now
        self._trim(0)
        self.trims += 1
        return True
