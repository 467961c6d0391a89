"""Exclusive jobs (embeddings, scores) in flight to a worker, each waiting for its `JobOut`.

A job is sent once a worker is ready (one that arrives while the worker
restarts waits; admission bounds how many). A client that leaves cancels
its job in the worker; a worker that is lost fails every job it held.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import attrs
import msgspec

from pipeline.errors import RequestError
from stages.remote.convert import error_out
from stages.remote.crossing import CancelIn, JobIn, JobOut, ToWorker

# How often a job that could not be queued (the worker's outbox full, or it was lost meanwhile) tries again.
_RETRY_S = 0.05


@attrs.define(eq=False)
class _Pending:
    done: anyio.Event = attrs.field(factory=anyio.Event)
    out: JobOut | None = None


async def _never_ready() -> None:
    raise RuntimeError("the job book is not bound to a worker")


@attrs.define
class JobBook:
    _send: Callable[[ToWorker], bool] = attrs.field(default=lambda message: False, init=False)
    _wait_ready: Callable[[], Awaitable[None]] = attrs.field(default=_never_ready, init=False)
    _pending: dict[int, _Pending] = attrs.field(factory=dict, init=False)
    _next: int = attrs.field(default=0, init=False)

    def bind(self, send: Callable[[ToWorker], bool], wait_ready: Callable[[], Awaitable[None]]) -> None:
        self._send, self._wait_ready = send, wait_ready

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def run(self, job: JobIn) -> JobOut:
        self._next += 1
        job = msgspec.structs.replace(job, job_id=self._next)
        pending = self._pending[job.job_id] = _Pending()
        try:
            while True:
                await self._wait_ready()
                if self._send(job):
                    break
                await anyio.sleep(_RETRY_S)
            await pending.done.wait()
        except BaseException:
            if not pending.done.is_set():
                self._send(CancelIn(job_id=job.job_id))
            raise
        finally:
            del self._pending[job.job_id]
        assert pending.out is not None
        return pending.out

    def finish(self, out: JobOut) -> None:
        if (pending := self._pending.get(out.job_id)) is not None:
            pending.out = out
            pending.done.set()

    def fail_all(self, error: RequestError) -> None:
        for job_id, pending in self._pending.items():
            if not pending.done.is_set():
                pending.out = JobOut(job_id=job_id, error=error_out(error))
                pending.done.set()
