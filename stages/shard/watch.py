"""The engine's watch over its follower ranks (rank 0 only), an actor of the supervisor.

When a follower is lost (its heartbeat connection closed, or silent past
the timeout) the watch fails every open request at once, aborts the
group so that a collective waiting on that rank fails instead of
hanging the model thread, and then crashes: the supervisor marks the
engine dead and `/health` answers 503.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus

from stages.shard.cluster import Cluster

log = structlog.get_logger(stage="shard")

_POLL = 0.2


class RankLost(RuntimeError):
    pass


@attrs.define
class ShardWatch:
    _cluster: Cluster = attrs.field(alias="cluster")
    _on_lost: Callable[[], None] = attrs.field(alias="on_lost")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        heartbeats = self._cluster.heartbeats
        assert heartbeats is not None, "only rank 0 watches"
        task_status.started()
        while not (lost := heartbeats.lost()):
            await anyio.sleep(_POLL)
        log.error("shard.rank_lost", ranks=lost)
        self._on_lost()
        self._cluster.abort()
        raise RankLost(f"rank(s) {lost} stopped answering")
