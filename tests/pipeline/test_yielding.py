"""The short switch interval while models load: set by the first load, kept while any runs, restored by the last."""

from __future__ import annotations

import sys

from pipeline.yielding import yielding_gil


def test_the_interval_is_short_while_any_load_runs_and_restored_after() -> None:
    before = sys.getswitchinterval()
    first, second = yielding_gil(), yielding_gil()
    first.__enter__()
    assert sys.getswitchinterval() < before
    second.__enter__()
    first.__exit__(None, None, None)
    # Loads overlap: the one still running keeps the loop's short waits.
    assert sys.getswitchinterval() < before
    second.__exit__(None, None, None)
    assert sys.getswitchinterval() == before
