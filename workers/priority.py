"""A loading worker yields the CPU to the models already serving, then serves at its usual priority.

A worker's start is seconds of CPU (imports, the tokenizer, the weights,
the first graphs). On a machine with few cores that is taken from the
other models' workers and the front, whose streams slow while it loads.
So, when the front asks (`YIELD_FLAG`: other models' workers are
serving), the worker starts `_LOADING_NICE` steps nicer and goes back
once its model is ready; a worker alone (the one model's restart) starts
at full speed. Going back lowers the nice value, which only a process
allowed to (root, CAP_SYS_NICE, or Linux's RLIMIT_NICE) may do: where it
may not, the worker is not made nicer at all, rather than serve niced.
On Linux a nice value belongs to each thread, so every thread is set back.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

_LOADING_NICE = 10
# The worker's command-line flag by which the front asks for it (stages/remote/process.py).
YIELD_FLAG = "--yield-while-loading"


def lower_while_loading() -> int | None:
    """Nicer by `_LOADING_NICE` when it can be undone; the nice value to go back to, or None."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if not _may_lower_to(base):
        return None
    os.setpriority(os.PRIO_PROCESS, 0, min(19, base + _LOADING_NICE))
    return base


def restore(base: int | None) -> None:
    if base is None:
        return
    tasks = Path("/proc/self/task")
    ids = [int(task.name) for task in tasks.iterdir()] if sys.platform == "linux" and tasks.is_dir() else [0]
    for thread_id in ids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpriority(os.PRIO_PROCESS, thread_id, base)


def _may_lower_to(base: int) -> bool:
    if os.geteuid() == 0:
        return True
    if sys.platform != "linux":
        return False
    import resource

    # RLIMIT_NICE's ceiling is 20 - rlim_cur: the lowest nice value an unprivileged thread may set.
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or 20 - soft <= base
