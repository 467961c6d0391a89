"""The supervisor: one inner task group that owns every long-lived actor.

It lives one level below Quart's lifespan (docs/STYLE.md, "One owner for the tree"): an actor crash cancels
its siblings here, is logged once, marks the engine dead, and the
supervisor returns normally so `/health` can answer 503. A crash before
every actor is ready is re-raised, so a server that cannot start says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus

log = structlog.get_logger(stage="supervisor")


class Actor(Protocol):
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...


@attrs.define
class Supervisor:
    """Starts actors in the given order (downstream first; docs/STYLE.md, "Readiness from downstream") and watches them.

    `on_stop` runs synchronously once the tree has stopped, for any reason,
    so that the owner can fail every reply still open.
    """

    _actors: Sequence[Actor] = attrs.field(alias="actors")
    _on_stop: Callable[[], None] = attrs.field(alias="on_stop")
    _dead: bool = attrs.field(default=False, init=False)
    _running: bool = attrs.field(default=False, init=False)

    @property
    def dead(self) -> bool:
        """An actor crashed: the engine will not serve again."""
        return self._dead

    @property
    def running(self) -> bool:
        return self._running

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            async with anyio.create_task_group() as group:
                for actor in self._actors:
                    await group.start(actor.run)
                started = self._running = True
                task_status.started()
        except* Exception as crash:
            self._dead = True
            log.error("engine.crashed", started=started, exc_info=crash)
            if not started:
                raise
        finally:
            self._running = False
            self._on_stop()
