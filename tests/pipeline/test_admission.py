"""pipeline/admission.py: a bounded number of requests in the engine (docs/STYLE.md, "Admission").

On trio these run under a MockClock (see conftest.py), so a timeout is
reached as soon as every task is blocked; on asyncio the timeouts are short.
"""

from __future__ import annotations

import anyio
import pytest

from pipeline.admission import Admission, AdmissionStatistics
from pipeline.errors import ErrorKind, RequestError

TIMEOUT = 0.05


def admission(capacity: int = 2, timeout: float = TIMEOUT, retry_after: float = 3.0) -> Admission:
    return Admission(capacity=capacity, timeout=timeout, retry_after=retry_after)


def stats(in_flight: int, capacity: int = 2, refused: int = 0, draining: bool = False) -> AdmissionStatistics:
    return AdmissionStatistics(in_flight=in_flight, capacity=capacity, refused=refused, draining=draining)


async def test_admits_up_to_capacity() -> None:
    """Up to `capacity` requests are admitted at once, each holding one ticket."""
    gate = admission(capacity=3)
    for _ in range(3):
        await gate.enter()
    assert gate.statistics() == stats(3, capacity=3)


@pytest.mark.parametrize("timeout", [0.0, TIMEOUT], ids=["zero-timeout", "timeout"])
async def test_a_free_ticket_is_taken_even_with_a_zero_timeout(timeout: float) -> None:
    """A zero admission timeout means "do not wait", not "refuse everything"."""
    gate = admission(capacity=1, timeout=timeout)
    await gate.enter()
    assert gate.statistics() == stats(1, capacity=1)


async def test_full_engine_refuses_with_429_after_the_timeout() -> None:
    """When no ticket frees up within the timeout the request is a 429 with Retry-After, and counted."""
    gate = admission(capacity=1, retry_after=3.0)
    await gate.enter()
    with pytest.raises(RequestError) as caught:
        await gate.enter()
    error = caught.value
    assert (error.kind, error.status, error.code, error.retry_after) == (
        ErrorKind.OVERLOADED,
        429,
        "rate_limit_exceeded",
        3.0,
    )
    assert gate.statistics() == stats(1, capacity=1, refused=1)


async def test_zero_timeout_refuses_at_once_when_full() -> None:
    """With no wait allowed, a full engine refuses immediately."""
    gate = admission(capacity=1, timeout=0.0)
    await gate.enter()
    with pytest.raises(RequestError) as caught:
        await gate.enter()
    assert caught.value.status == 429


async def test_a_waiting_request_gets_the_ticket_that_frees_up() -> None:
    """A request waiting for a ticket is admitted when another leaves before its deadline."""
    gate = admission(capacity=1, timeout=60.0)
    await gate.enter()
    admitted = anyio.Event()

    async def wait_for_ticket() -> None:
        await gate.enter()
        admitted.set()

    async with anyio.create_task_group() as group:
        group.start_soon(wait_for_ticket)
        await anyio.wait_all_tasks_blocked()
        assert not admitted.is_set()
        gate.leave()
    assert admitted.is_set()
    assert gate.statistics() == stats(1, capacity=1)


async def test_draining_refuses_new_requests_with_503() -> None:
    """Once draining starts, every new request is a 503 that says the server is shutting down."""
    gate = admission()
    await gate.enter()
    gate.start_draining()
    with pytest.raises(RequestError) as caught:
        await gate.enter()
    assert (caught.value.status, caught.value.code) == (503, "shutting_down")
    assert gate.statistics() == stats(1, draining=True)


async def test_a_request_waiting_when_draining_starts_gets_503_and_leaks_no_ticket() -> None:
    """A waiter that gets its ticket after draining began is refused, and the ticket goes back."""
    gate = admission(capacity=1, timeout=60.0)
    await gate.enter()
    outcome: list[int] = []

    async def wait_for_ticket() -> None:
        try:
            await gate.enter()
        except RequestError as error:
            outcome.append(error.status)

    async with anyio.create_task_group() as group:
        group.start_soon(wait_for_ticket)
        await anyio.wait_all_tasks_blocked()
        gate.start_draining()
        gate.leave()
    assert outcome == [503]
    assert gate.statistics() == stats(0, capacity=1, draining=True)
    assert await gate.wait_idle(TIMEOUT)


async def test_a_cancelled_waiter_leaks_nothing() -> None:
    """Cancelling a request while it waits for a ticket leaves the counts and the capacity intact."""
    gate = admission(capacity=1, timeout=60.0)
    await gate.enter()
    with anyio.move_on_after(TIMEOUT) as scope:
        await gate.enter()
    assert scope.cancelled_caught
    assert gate.statistics() == stats(1, capacity=1)
    gate.leave()
    await gate.enter()
    assert gate.statistics() == stats(1, capacity=1)


async def test_leave_returns_the_ticket() -> None:
    """After a request leaves, its ticket admits the next one without waiting."""
    gate = admission(capacity=1, timeout=0.0)
    await gate.enter()
    gate.leave()
    await gate.enter()
    assert gate.statistics() == stats(1, capacity=1)


async def test_wait_idle_when_nothing_is_in_flight() -> None:
    """An idle engine is idle at once, before and after traffic."""
    gate = admission()
    assert await gate.wait_idle(0.0)
    await gate.enter()
    gate.leave()
    assert await gate.wait_idle(0.0)


async def test_wait_idle_times_out_while_requests_are_in_flight() -> None:
    """wait_idle gives up (False) when a request still holds a ticket at the deadline."""
    gate = admission()
    await gate.enter()
    assert await gate.wait_idle(TIMEOUT) is False


async def test_wait_idle_returns_when_the_last_request_leaves() -> None:
    """wait_idle wakes when the in-flight count reaches zero, not before."""
    gate = admission()
    await gate.enter()
    await gate.enter()
    result: list[bool] = []

    async def wait() -> None:
        result.append(await gate.wait_idle(60.0))

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        gate.leave()
        await anyio.wait_all_tasks_blocked()
        assert result == []
        gate.leave()
    assert result == [True]
