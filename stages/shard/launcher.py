"""A rank stops when the launcher that started it is gone.

`mlx.launch` starts every rank as its child and ends them when one exits;
but when the launcher itself is ended by a signal, its ranks went on
without a parent, rank 0 still serving HTTP. So each rank watches its
parent: on Linux the kernel sends it SIGTERM when the parent dies
(`prctl(PR_SET_PDEATHSIG)`), and everywhere a thread looks at the parent
id every `POLL_S` seconds (the kernel's signal follows the parent
*thread* that forked us; a reparented process sees another parent id).
SIGTERM is the ordinary stop: rank 0 drains and stops, a follower ends.
If it is still running `GRACE_S` seconds later, the rank exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

import structlog

log = structlog.get_logger(stage="shard")

POLL_S = 1.0
# Rank 0's drain (open streams get their terminal events) has this long before the process exits anyway.
GRACE_S = 30.0
_PR_SET_PDEATHSIG = 1


def watch_launcher() -> None:
    """Stop this rank once its parent (the launcher) is gone; call once, early."""
    parent = os.getppid()
    if parent <= 1:
        # Started by init or a container's first process: there is no launcher to outlive.
        return
    if sys.platform.startswith("linux"):
        _ask_kernel()
    if os.getppid() != parent:
        _launcher_lost(parent)
        return
    threading.Thread(target=_poll, args=(parent,), name="shard-launcher-watch", daemon=True).start()


def _ask_kernel() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            log.warning("shard.pdeathsig_unavailable", errno=ctypes.get_errno())
    except OSError:
        log.warning("shard.pdeathsig_unavailable")


def _poll(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    _launcher_lost(parent)


def _launcher_lost(parent: int) -> None:
    log.error("shard.launcher_lost", launcher_pid=parent, rank=os.environ.get("MLX_RANK"))
    os.kill(os.getpid(), signal.SIGTERM)
    # SIGTERM starts the ordinary stop; a rank still here after the grace ends regardless.
    timer = threading.Timer(GRACE_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()
