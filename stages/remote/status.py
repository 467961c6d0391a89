"""What the front reports of a model's worker: its state, its process, its restarts; and the error a loss is."""

from __future__ import annotations

import enum

import attrs

from pipeline.errors import ErrorKind, RequestError
from stages.model_thread.gateway import GatewayStatistics
from stages.model_thread.handoff import HandoffStatistics


class WorkerState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


@attrs.frozen(kw_only=True)
class WorkerStatus:
    state: str
    # The worker process's id (from its start, before it connects); None while none runs.
    pid: int | None
    restarts: int
    # The worker was a spare, started and imported before it was needed (stages/remote/spare.py).
    spare: bool = False
    # The front's zygote forked it, rather than spawned it (stages/remote/zygote.py).
    forked: bool = False


@attrs.define
class ServingCount:
    """This front's workers that are ready now (several models): a worker that starts beside them yields the
    CPU until it is ready, so their streams keep their pace; a worker alone starts at full speed."""

    count: int = 0


def worker_lost(reason: str) -> RequestError:
    return RequestError(
        kind=ErrorKind.UNAVAILABLE,
        code="worker_lost",
        message=f"The model worker stopped ({reason}); the request was not completed. Retry it.",
    )


def no_statistics(pending: int) -> GatewayStatistics:
    """A worker's figures before its first heartbeat."""
    handoff = HandoffStatistics(
        steps_ahead=0, steps_undelivered=0, steps_undelivered_max=0, loop_wait_s=0, idle_wait_s=0
    )
    return GatewayStatistics(
        active=0,
        pending=pending,
        steps=0,
        generated_tokens=0,
        waiting_for_memory=0,
        kv_held_bytes=0,
        kv_budget_bytes=0,
        preemptions=0,
        resumed=0,
        kv_bytes_in_use=0,
        mlx_active_bytes=0,
        mlx_cache_bytes=0,
        handoff=handoff,
    )
