"""stages/models/heap.py: the C heap's trim runs when forced, else at most once per interval."""

from __future__ import annotations

import sys

import pytest

from stages.models.heap import HeapTrimmer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_trims_at_most_once_per_interval_unless_forced() -> None:
    now = [100.0]
    trimmer = HeapTrimmer(interval=10.0, clock=lambda: now[0])
    assert trimmer.available
    assert trimmer.maybe()
    now[0] += 9.9
    assert not trimmer.maybe()
    assert trimmer.maybe(force=True)
    now[0] += 10.0
    assert trimmer.maybe()
    assert trimmer.trims == 3
