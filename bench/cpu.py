"""A server's CPU time, read from /proc: the process and every descendant alive now.

hypercorn serves from a worker process it spawns, and mlx_lm.server from
its own, so the tree counts, not the pid alone. None where /proc is
missing (macOS): the report then prints "-".
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system seconds of `pid` and its live descendants, or None without /proc."""
    if not (_PROC / str(pid)).exists():
        return None
    stats = _all_stats()
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, (ppid, _) in stats.items() if ppid == parent and child not in tree]
        tree.update(children)
        frontier.extend(children)
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(stats[p][1] for p in tree if p in stats) / ticks


def tree_cpu_split(pid: int, worker_name: str = "relay-worker") -> tuple[float, float] | None:
    """(front, worker) seconds of `pid`'s tree: a process named `worker_name` (workers/main.py names itself so,
    forked or spawned), and its descendants, count as the worker; None without /proc."""
    if not (_PROC / str(pid)).exists():
        return None
    stats = _all_stats()
    front, worker, frontier = 0, 0, [(pid, False)]
    seen = {pid}
    while frontier:
        parent, in_worker = frontier.pop()
        in_worker = in_worker or _name(parent) == worker_name
        ticks = stats.get(parent, (0, 0))[1]
        front, worker = (front, worker + ticks) if in_worker else (front + ticks, worker)
        for child, (ppid, _) in stats.items():
            if ppid == parent and child not in seen:
                seen.add(child)
                frontier.append((child, in_worker))
    per_second = os.sysconf("SC_CLK_TCK")
    return front / per_second, worker / per_second


def _name(pid: int) -> str:
    try:
        return (_PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def _all_stats() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, utime + stime in clock ticks), for every process readable now."""
    found = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = raw[raw.rindex(")") + 2 :].split()
        found[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return found
