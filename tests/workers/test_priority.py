"""A loading worker's lower priority, and its return, in a process of its own (nice values are per thread on Linux)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

_PROBE = """
import os, threading
from workers.priority import lower_while_loading, restore

def nice(thread_id=0):
    return os.getpriority(os.PRIO_PROCESS, thread_id)

start = nice()
base = lower_while_loading()
loading = nice()
# A thread started while loading (the model thread, MLX's) inherits the nicer value; restore reaches it too.
done = threading.Event()
ids = []
def work():
    ids.append(threading.get_native_id())
    done.wait()
thread = threading.Thread(target=work)
thread.start()
while not ids:
    pass
in_thread = nice(ids[0])
restore(base)
print(start, base, loading, in_thread, nice(), nice(ids[0]))
done.set()
"""


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="going back needs root (or RLIMIT_NICE)")
def test_a_loading_worker_is_nicer_until_it_goes_back_in_every_thread() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    start, base, loading, in_thread, after, thread_after = map(int, out.stdout.split())
    assert base == start and loading > start and in_thread == loading
    assert after == thread_after == start
