"""The front's exclusive queue when the model runs in a worker: the same face, the work runs over there.

`ModelWork` tokenizes and checks inputs in the front as before, then
submits an `EmbedWork` or `ScoreWork`; this queue takes the admission
ticket (429/503 as in-process), sends the work's inputs as a `JobIn` and
rebuilds its result from the `JobOut`. The worker's own `ExclusiveQueue`
runs it between decode steps; `/stats` shows that queue's figures.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import attrs
import numpy as np

from stages.model_thread.embed import EmbedWork, ScoreWork
from stages.model_thread.exclusive import ExclusiveQueue, ExclusiveStatistics, Work
from stages.remote.convert import request_error
from stages.remote.crossing import JobIn, JobOut
from stages.remote.jobs import JobBook

T = TypeVar("T")


@attrs.define
class RemoteExclusiveQueue(ExclusiveQueue):
    jobs: JobBook = attrs.field(factory=JobBook, kw_only=True)
    # The worker's own figures, from its last heartbeat.
    remote: ExclusiveStatistics | None = attrs.field(default=None, kw_only=True)

    async def submit(self, work: Work[T], *, kind: str, request_id: str, trace_id: str, rate_key: str = "") -> T:
        if self._stopped is not None:
            raise self._stopped
        await self._admission.enter()
        try:
            out = await self.jobs.run(_job_in(work, request_id=request_id, trace_id=trace_id, rate_key=rate_key))
        finally:
            self._admission.leave()
        if out.error is not None:
            raise request_error(out.error)
        return cast(T, _result(out))

    def queue_unawaited(self, work: Work[Any], *, kind: str) -> None:
        """The worker loads its dedicated embedding model itself, at its start."""

    def statistics(self) -> ExclusiveStatistics:
        own = super().statistics()
        return own if self.remote is None else attrs.evolve(self.remote, admission=own.admission)


def _job_in(work: Work[Any], *, request_id: str, trace_id: str, rate_key: str) -> JobIn:
    if isinstance(work, EmbedWork):
        inputs = [list(tokens) for tokens in work.inputs]
        return JobIn(
            job_id=0,
            kind="embed",
            inputs=inputs,
            request_id=request_id,
            trace_id=trace_id,
            rate_key=rate_key,
            side=work.side is not None,
            pooling=work.pooling,
            dimensions=work.dimensions,
        )
    if isinstance(work, ScoreWork):
        inputs = [list(tokens) for tokens in work.inputs]
        return JobIn(
            job_id=0,
            kind="score",
            inputs=inputs,
            request_id=request_id,
            trace_id=trace_id,
            rate_key=rate_key,
            side=work.side is not None,
            yes=work.yes,
            no=work.no,
        )
    raise TypeError(f"no worker job for {type(work).__name__}")


def _result(out: JobOut) -> object:
    if out.vectors is not None:
        return [np.frombuffer(vector, dtype=np.float32) for vector in out.vectors]
    return list(out.scores or ())
