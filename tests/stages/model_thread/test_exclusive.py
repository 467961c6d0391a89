"""stages/model_thread/exclusive.py: the queue the model thread drains between decode steps, driven by hand."""

from __future__ import annotations

import time
from typing import Any

import anyio
import attrs
import pytest
import structlog.testing

from pipeline.admission import Admission
from pipeline.errors import ErrorKind, RequestError, invalid
from stages.model_thread.exclusive import ExclusiveQueue


@attrs.define
class Sleepy:
    """Work of `units` items, each taking `seconds` on the thread; `fail` raises at the first chunk."""

    units: int
    seconds: float = 0.0
    fail: Exception | None = None
    chunks: list[int] = attrs.field(factory=list)
    done: int = 0

    def remaining(self) -> int:
        return self.units - self.done

    def run_chunk(self, model: Any, max_units: int) -> int:
        if self.fail is not None:
            raise self.fail
        ran = max(1, min(max_units, self.remaining()))
        time.sleep(ran * self.seconds)
        self.done += ran
        self.chunks.append(ran)
        return ran

    def result(self) -> int:
        return self.done


def _queue(capacity: int = 4, share: float = 0.5) -> ExclusiveQueue:
    return ExclusiveQueue(admission=Admission(capacity=capacity, timeout=0.0, retry_after=1.0), share=share)


async def _between(queue: ExclusiveQueue, *, busy: bool) -> None:
    queue.deliver(await anyio.to_thread.run_sync(lambda: queue.between_steps(None, busy=busy)))


async def _submitted(queue: ExclusiveQueue, work: Sleepy, results: list[object]) -> None:
    try:
        results.append(await queue.submit(work, kind="embed", request_id="r", trace_id="t"))
    except RequestError as error:
        results.append(error)


async def test_an_idle_thread_runs_small_jobs_together_in_one_turn() -> None:
    queue, results = _queue(), []
    async with anyio.create_task_group() as group:
        for units in (3, 5):
            group.start_soon(_submitted, queue, Sleepy(units), results)
        await anyio.wait_all_tasks_blocked()
        await _between(queue, busy=False)
    assert sorted(results) == [3, 5]  # type: ignore[type-var]
    assert queue.statistics().finished == 2 and not queue.pending


async def test_an_idle_thread_runs_a_large_job_in_turns_and_returns_between_them() -> None:
    """Each idle call runs one turn (20 ms of 1 ms units here) and returns, so the gateway can take its intake
    between two turns: the 200-unit job takes many calls, never one."""
    queue = ExclusiveQueue(admission=Admission(capacity=4, timeout=0.0, retry_after=1.0), share=0.5, idle_turn=0.02)
    results: list[object] = []
    work = Sleepy(200, seconds=0.001)
    async with anyio.create_task_group() as group:
        group.start_soon(_submitted, queue, work, results)
        await anyio.wait_all_tasks_blocked()
        calls = 0
        while not results:
            await _between(queue, busy=False)
            calls += 1
    assert results == [200]
    assert calls > 3 and len(work.chunks) > 3 and max(work.chunks) < 200


async def test_rows_arriving_during_an_idle_job_wait_one_turn_then_the_job_waits_for_its_period() -> None:
    """A job started on an idle server; rows come: the job's next turn waits for the busy policy's period."""
    admission = Admission(capacity=4, timeout=0.0, retry_after=1.0)
    queue = ExclusiveQueue(admission=admission, share=0.5, period=5, idle_turn=0.02)
    work = Sleepy(1000, seconds=0.001)
    async with anyio.create_task_group() as group:
        group.start_soon(_submitted, queue, work, [])
        await anyio.wait_all_tasks_blocked()
        await _between(queue, busy=False)
        after_idle_turn = work.done
        assert 0 < after_idle_turn < 1000
        for _ in range(4):
            await _between(queue, busy=True)
            await anyio.sleep(0.005)  # the step
        assert work.done == after_idle_turn
        await _between(queue, busy=True)
        assert work.done > after_idle_turn
        group.cancel_scope.cancel()


async def test_while_rows_run_a_large_job_spreads_over_steps() -> None:
    """With a 20 ms step and a half share, each call runs about 10 ms of 1 ms units, not the job's 200."""
    queue, results, work = _queue(share=0.5), [], Sleepy(200, seconds=0.001)
    async with anyio.create_task_group() as group:
        group.start_soon(_submitted, queue, work, results)
        await anyio.wait_all_tasks_blocked()
        calls = 0
        while not results:
            await _between(queue, busy=True)
            calls += 1
            await anyio.sleep(0.02)  # the step
    assert results == [200]
    assert calls > 3 and len(work.chunks) > 3 and max(work.chunks) < 200


async def test_with_a_period_work_waits_for_its_turn_and_spends_what_it_earned() -> None:
    """Period 5: four busy calls run nothing, the fifth runs about five steps' share."""
    queue = ExclusiveQueue(admission=Admission(capacity=4, timeout=0.0, retry_after=1.0), share=0.5, period=5)
    results: list[object] = []
    work = Sleepy(1000, seconds=0.001)
    async with anyio.create_task_group() as group:
        group.start_soon(_submitted, queue, work, results)
        await anyio.wait_all_tasks_blocked()
        for call in range(1, 16):
            await _between(queue, busy=True)
            assert (work.done > 0) is (call >= 5)
            await anyio.sleep(0.02)
        assert len(work.chunks) >= 2 and max(work.chunks) < 200 and work.done < 1000
        group.cancel_scope.cancel()
    assert queue.statistics().step_gaps["le_inf"] >= 0 and sum(queue.statistics().step_gaps.values()) == 14


async def test_a_job_whose_client_left_is_dropped_unrun() -> None:
    queue, work = _queue(), Sleepy(10)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as group:
            group.start_soon(_submitted, queue, work, [])
            await anyio.wait_all_tasks_blocked()
            group.cancel_scope.cancel()
        await _between(queue, busy=False)
    assert work.done == 0 and not queue.pending
    assert [entry["outcome"] for entry in logs if entry["event"] == "request.embed"] == ["cancelled"]
    assert queue.statistics().admission.in_flight == 0


@pytest.mark.parametrize(
    ("failure", "kind"),
    [(invalid("bad input", param="input"), ErrorKind.INVALID_REQUEST), (RuntimeError("bug"), ErrorKind.INTERNAL)],
)
async def test_a_failing_job_fails_alone(failure: Exception, kind: ErrorKind) -> None:
    queue, results = _queue(), []
    async with anyio.create_task_group() as group:
        group.start_soon(_submitted, queue, Sleepy(2, fail=failure), results)
        group.start_soon(_submitted, queue, Sleepy(4), results)
        await anyio.wait_all_tasks_blocked()
        # Logging the first failure's stack can take a whole turn: the second job may need a turn of its own.
        while queue.pending:
            await _between(queue, busy=False)
    errors = [r for r in results if isinstance(r, RequestError)]
    assert [e.kind for e in errors] == [kind] and 4 in results


async def test_a_full_queue_is_a_429_and_a_stopped_one_a_503() -> None:
    queue, results = _queue(capacity=1), []
    async with anyio.create_task_group() as group:
        group.start_soon(_submitted, queue, Sleepy(1), results)
        await anyio.wait_all_tasks_blocked()
        await _submitted(queue, Sleepy(1), results)
        assert isinstance(results[-1], RequestError) and results[-1].status == 429
        queue.stop(dead=False)
    assert isinstance(results[-1], RequestError) and results[-1].status == 503
    with pytest.raises(RequestError) as later:
        await queue.submit(Sleepy(1), kind="embed", request_id="r", trace_id="t")
    assert later.value.status == 503


async def test_queued_work_wakes_an_idle_gateway() -> None:
    queue, results = _queue(), []
    woken = anyio.Event()
    queue.wake_with(woken.set)
    async with anyio.create_task_group() as group:
        group.start_soon(_submitted, queue, Sleepy(1), results)
        with anyio.fail_after(5):
            await woken.wait()
        assert queue.pending
        await _between(queue, busy=False)
    assert results == [1]
