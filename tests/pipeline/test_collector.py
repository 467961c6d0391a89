"""Each entry module imports with the collector off, then freezes what it imported and turns it back on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

PROBE = """
import gc
import {module}
frozen = gc.get_freeze_count()
young = len(gc.get_objects())
print(gc.isenabled(), frozen, young)
"""


@pytest.mark.parametrize("module", ["app", "workers.main"])
def test_the_imported_heap_is_frozen_and_the_collector_on(module: str) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    enabled, frozen, young = probe.stdout.split()
    assert enabled == "True"
    # The imports' objects are frozen (about 225,000 in the front), not left for the collector to walk.
    assert int(frozen) > 100_000 and int(young) < int(frozen) / 10, (frozen, young)
