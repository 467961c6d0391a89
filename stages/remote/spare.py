"""A spare worker: one process started ahead of need, its imports done, idle until a start takes it.

A worker's start is mostly imports (mlx, mlx-lm, transformers: `imports_s`
in `worker.ready`), which do not depend on the model: a worker imports,
connects, and only then reads which model to serve from its first frame
(`SettingsIn`). So a worker that has connected and waits for that frame is
any model's worker. The front keeps at most one such spare: a restart or a
model's load takes it and sends it its settings, and a fresh spare is
started once that worker is ready, nicer while it imports (as a loading
worker beside others, workers/priority.py), so its start never competes
with a load or with streams. A start that comes while the spare is still importing (a
restart soon after the last one) waits for it rather than start a second
process beside it, and sets it back to the front's priority first.

When (`MLX_RELAY_WORKER_SPARE`): `on` always, `off` never, `auto` (the
default) once the front serves several models (each load of one takes
it) or once any worker has restarted, where workers are spawned: a worker
the front's zygote forks has its imports done already
(stages/remote/zygote.py). A spare costs its memory (about
90 MiB resident on Linux, DESIGN.md "Model workers") and nothing else
while idle. One pool per process (several engines share it); it ends its
spare when the last gateway using it ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup

from stages.remote.process import WorkerLost, WorkerProcess, forks_workers, start_worker

log = structlog.get_logger(stage="remote")
# How often a start waiting for the spare sets it back to the front's priority.
_HURRY_EVERY_S = 0.1


@attrs.define
class SparePool:
    # The front serves several models (fleet/fleet.py says so): each load may take the spare.
    several: bool = False
    # Workers of this front restarted (any model's): a front whose workers crash keeps a spare.
    restarts: int = 0
    # Starts that took the spare, for /health.
    taken: int = 0
    _spare: WorkerProcess | None = None
    _starting: bool = False
    # The spare being started, once its process runs; set when its start has settled (parked or failed).
    _starting_pid: int | None = None
    # The group the start runs in: a start cancelled before it ran settles as its group ends (`leave`).
    _starting_in: TaskGroup | None = None
    _settled: anyio.Event = attrs.field(factory=anyio.Event)
    # Gateways running: the spare ends with the last.
    _users: int = 0

    def wanted(self, mode: str) -> bool:
        # A forked worker skips the imports a spare is there to have done.
        return mode == "on" or (mode == "auto" and (self.several or self.restarts > 0) and not forks_workers())

    async def take(self) -> WorkerProcess | None:
        """The spare, if one is idle and alive (a dead one is ended and forgotten), or is starting (then waited
        for: it is further along than a new worker would be)."""
        if self._spare is None and self._starting:
            log.info("worker.spare_hurried", pid=self._starting_pid)
            settled = self._settled
            while not settled.is_set():
                # Again and again: a spare just spawned lowers its own priority as its interpreter starts.
                if self._starting_pid is not None:
                    _hurry(self._starting_pid)
                with anyio.move_on_after(_HURRY_EVERY_S):
                    await settled.wait()
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        if not spare.alive:
            await spare.end(0.0)
            log.warning("worker.spare_lost", pid=spare.pid, reason=await spare.printed())
            return None
        spare.spare = True
        self.taken += 1
        return spare

    def refill(self, group: TaskGroup, *, mode: str, connect_timeout: float) -> None:
        """Start a spare in `group` (the caller's lifetime bounds its start) unless one is idle or starting."""
        if self.wanted(mode) and self._spare is None and not self._starting:
            self._starting, self._settled, self._starting_in = True, anyio.Event(), group
            group.start_soon(self._start, connect_timeout)

    async def _start(self, connect_timeout: float) -> None:
        try:
            worker = await start_worker(connect_timeout=connect_timeout, yield_cpu=True, spawned=self._spawned)
        except WorkerLost as error:
            # Not tried again until a start succeeds (then refills): a spare that cannot start never loops.
            log.warning("worker.spare_failed", reason=str(error))
            return
        finally:
            self._settle()
        if self._users == 0 or self._spare is not None:
            await worker.end(0.0)
            return
        self._spare = worker
        log.info("worker.spare_ready", pid=worker.pid)

    def _spawned(self, pid: int) -> None:
        self._starting_pid = pid

    def _settle(self) -> None:
        self._starting, self._starting_pid, self._starting_in = False, None, None
        self._settled.set()

    def enter(self) -> None:
        self._users += 1

    async def leave(self, group: TaskGroup | None) -> None:
        """A gateway whose task group (`group`, ended) is done."""
        if self._starting and self._starting_in is group:
            self._settle()
        self._users -= 1
        if self._users == 0 and (spare := self._spare) is not None:
            self._spare = None
            await spare.end(0.0)


# Process-wide, not per gateway: a spare is any model's worker, so every engine of this front (the fleet's models)
# takes from and refills the one pool, and the fleet tells it when it serves several models.
SPARES = SparePool()


def _hurry(pid: int) -> None:
    """Every thread of the starting spare back to the front's nice value (Linux; where the front may: the spare
    was niced only where it may go back, and the front runs as the same user). Elsewhere it imports as it is."""
    tasks = Path(f"/proc/{pid}/task")
    if sys.platform != "linux" or not tasks.is_dir():
        return
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(task.name), base)
