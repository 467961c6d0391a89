"""pipeline/channels.py: bounded channels and the per-request ReplySlot."""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio
import pytest

from pipeline.channels import Channel, ReplyClosed, ReplySlot, open_channel
from pipeline.errors import RequestError, invalid
from pipeline.events import CompletionEvent, FinishReason, Summary, TextDelta, Usage

SUMMARY = Summary(finish_reason=FinishReason.STOP, usage=Usage(prompt_tokens=2, completion_tokens=1))
ERROR = invalid("nope", param="messages")


def delta(text: str) -> list[CompletionEvent]:
    return [TextDelta(text=text)]


# -- open_channel -------------------------------------------------------------


@pytest.mark.parametrize("capacity", [-1, math.inf], ids=["negative", "infinite"])
def test_open_channel_refuses_unbounded_or_negative(capacity: float) -> None:
    """Every channel has a finite, non-negative bound, and the error names the channel
    (docs/STYLE.md, "Bounded channels")."""
    with pytest.raises(ValueError, match="'steps'"):
        open_channel(capacity, name="steps")  # type: ignore[arg-type]


@pytest.mark.parametrize("capacity", [0, 1, 3])
def test_open_channel_holds_exactly_its_capacity(capacity: int) -> None:
    """A channel buffers `capacity` items, and the next send without a reader would block."""
    channel: Channel[int] = open_channel(capacity, name="jobs")
    with channel.send, channel.receive:
        assert channel.name == "jobs"
        for item in range(capacity):
            channel.send.send_nowait(item)
        with pytest.raises(anyio.WouldBlock):
            channel.send.send_nowait(capacity)
        assert channel.send.statistics().max_buffer_size == capacity
        assert [channel.receive.receive_nowait() for _ in range(capacity)] == list(range(capacity))


# -- ReplySlot: producer side -------------------------------------------------


def finish(slot: ReplySlot[str]) -> None:
    slot.finish(SUMMARY)


def fail(slot: ReplySlot[str]) -> None:
    slot.fail(ERROR)


def close(slot: ReplySlot[str]) -> None:
    slot.close()


ENDINGS = [pytest.param(finish, id="finished"), pytest.param(fail, id="failed"), pytest.param(close, id="closed")]


@pytest.mark.parametrize("end", ENDINGS)
def test_producers_are_refused_once_the_slot_is_done(end: Callable[[ReplySlot[str]], None]) -> None:
    """After finish, fail or close, every producer call returns False, telling the stage to drop the request."""
    slot: ReplySlot[str] = ReplySlot("r1")
    assert slot.accept("request") and slot.put(delta("a"))
    end(slot)
    assert slot.done
    assert slot.accept("again") is False
    assert slot.put(delta("b")) is False
    assert slot.finish(SUMMARY) is False
    assert slot.fail(ERROR) is False


@pytest.mark.parametrize(
    ("end", "closed", "has_summary"),
    [
        pytest.param(finish, False, True, id="finished"),
        pytest.param(fail, False, False, id="failed"),
        pytest.param(close, True, False, id="closed"),
    ],
)
def test_done_closed_and_summary(end: Callable[[ReplySlot[str]], None], closed: bool, has_summary: bool) -> None:
    """`closed` means only that the reader left; `summary` exists only after finish."""
    slot: ReplySlot[str] = ReplySlot("r1")
    assert not slot.done and not slot.closed
    end(slot)
    assert slot.done and slot.closed is closed
    if has_summary:
        assert slot.summary is SUMMARY
    else:
        with pytest.raises(RuntimeError, match="not finished"):
            slot.summary  # noqa: B018


def test_summary_before_finish_is_an_error() -> None:
    """Reading the summary of a running reply is a bug, not a None."""
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.put(delta("a"))
    with pytest.raises(RuntimeError):
        slot.summary  # noqa: B018


@pytest.mark.parametrize("end", ENDINGS)
def test_on_done_runs_exactly_once(end: Callable[[ReplySlot[str]], None]) -> None:
    """The owner's release hook (an admission ticket) runs once however the reply ends, even if ended twice."""
    calls: list[str] = []
    slot: ReplySlot[str] = ReplySlot("r1", on_done=lambda: calls.append("done"))
    slot.put(delta("a"))
    assert calls == []
    end(slot)
    end(slot)
    slot.close()
    slot.finish(SUMMARY)
    assert calls == ["done"]


def test_close_calls_the_bound_abort_once() -> None:
    """Closing a running reply tells the gateway to drop its row, exactly once
    (docs/STYLE.md, "Cancellation through scopes")."""
    aborts: list[str] = []
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.bind_abort(lambda: aborts.append("r1"))
    slot.close()
    slot.close()
    with slot:
        pass
    assert aborts == ["r1"]


@pytest.mark.parametrize(("end", "expected"), [(finish, []), (fail, ["r1"])], ids=["finished", "failed"])
def test_close_after_the_end_does_not_abort(end: Callable[[ReplySlot[str]], None], expected: list[str]) -> None:
    """A finished row is gone and a failed one was aborted when it failed: close() sends no (second) abort."""
    aborts: list[str] = []
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.bind_abort(lambda: aborts.append("r1"))
    end(slot)
    slot.close()
    assert aborts == expected
    assert not slot.closed


def test_close_before_a_row_exists_needs_no_abort() -> None:
    """A reply closed before the gateway bound an abort just closes."""
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.close()
    assert slot.closed


def test_with_block_closes_the_reply() -> None:
    """`with reply:` closes it on exit, also when the body raises (a cancelled handler)."""
    slot: ReplySlot[str] = ReplySlot("r1")
    with pytest.raises(KeyError), slot:
        raise KeyError("cancelled")
    assert slot.closed


@pytest.mark.parametrize(
    ("trace_id", "expected"),
    [pytest.param("", "r1", id="defaults-to-request-id"), pytest.param("client-7", "client-7", id="client-id")],
)
def test_log_context(trace_id: str, expected: str) -> None:
    """Every log line carries the request id and the client's trace id (or the request id)."""
    assert ReplySlot("r1", trace_id).log_context == {"request_id": "r1", "trace_id": expected}


# -- ReplySlot: reader side ---------------------------------------------------


async def collect(slot: ReplySlot[str]) -> list[list[CompletionEvent]]:
    return [batch async for batch in slot]


async def test_puts_merge_while_the_reader_is_behind() -> None:
    """Events put before the reader looks arrive as one batch, in order; then iteration ends at finish."""
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.put(delta("a"))
    slot.put(delta("b") + delta("c"))
    slot.put([])
    slot.finish(SUMMARY)
    assert await collect(slot) == [delta("a") + delta("b") + delta("c")]
    assert slot.summary is SUMMARY


async def test_reader_gets_each_batch_as_it_is_put() -> None:
    """A waiting reader wakes for each put, and stops after finish without a spurious empty batch."""
    slot: ReplySlot[str] = ReplySlot("r1")
    seen: list[list[CompletionEvent]] = []

    async def read() -> None:
        async for batch in slot:
            seen.append(batch)

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        for text in ("x", "y"):
            slot.put(delta(text))
            await anyio.wait_all_tasks_blocked()
        slot.put([])
        await anyio.wait_all_tasks_blocked()
        slot.finish(SUMMARY)
    assert seen == [delta("x"), delta("y")]


async def test_failure_after_events_raises_after_they_are_read() -> None:
    """Events put before a failure are still delivered; then the reader gets the RequestError."""
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.put(delta("a"))
    slot.fail(ERROR)
    iterator = slot.__aiter__()
    assert await iterator.__anext__() == delta("a")
    with pytest.raises(RequestError) as caught:
        await iterator.__anext__()
    assert caught.value is ERROR


async def test_close_wakes_a_waiting_reader_and_ends_iteration() -> None:
    """A reader blocked on the slot stops cleanly when the slot is closed."""
    slot: ReplySlot[str] = ReplySlot("r1")
    result: list[list[list[CompletionEvent]]] = []

    async def read() -> None:
        result.append(await collect(slot))

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        slot.close()
    assert result == [[]]


async def test_accepted_waits_for_a_stage_to_accept() -> None:
    """accepted() returns the request a stage accepted, waking when it does."""
    slot: ReplySlot[str] = ReplySlot("r1")
    got: list[str] = []

    async def wait() -> None:
        got.append(await slot.accepted())

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        assert slot.accept("the request")
    assert got == ["the request"]
    assert await slot.accepted() == "the request"


async def test_accepted_raises_the_failure_of_an_unaccepted_request() -> None:
    """A request that failed before acceptance (a 400) surfaces as its RequestError."""
    slot: ReplySlot[str] = ReplySlot("r1")

    async def fail_soon() -> None:
        await anyio.wait_all_tasks_blocked()
        slot.fail(ERROR)

    async with anyio.create_task_group() as group:
        group.start_soon(fail_soon)
        with pytest.raises(RequestError) as caught:
            await slot.accepted()
    assert caught.value is ERROR


async def test_accepted_on_a_closed_reply_is_an_error() -> None:
    """accepted() never waits forever on a reply that was closed unaccepted."""
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.close()
    with pytest.raises(ReplyClosed):
        await slot.accepted()


async def test_accepted_then_failed_still_returns_the_request() -> None:
    """Once accepted, a later failure is reported by iteration, not by accepted()."""
    slot: ReplySlot[str] = ReplySlot("r1")
    slot.accept("req")
    slot.fail(ERROR)
    assert await slot.accepted() == "req"
    with pytest.raises(RequestError):
        await collect(slot)


async def test_cancelling_the_reader_leaves_events_for_the_next_read() -> None:
    """A cancelled wait loses nothing: events put later are still there to read."""
    slot: ReplySlot[str] = ReplySlot("r1")
    with anyio.move_on_after(0.01) as scope:
        await collect(slot)
    assert scope.cancelled_caught
    slot.put(delta("late"))
    slot.finish(SUMMARY)
    assert await collect(slot) == [delta("late")]


# -- nudges (edge/keepalive.py) ---------------------------------------------------


async def test_a_nudge_wakes_a_waiting_reader_with_an_empty_batch() -> None:
    reply: ReplySlot[str] = ReplySlot("r")
    batches: list[list[CompletionEvent]] = []

    async def read_one() -> None:
        batches.append(await reply.__anext__())

    async with anyio.create_task_group() as group:
        group.start_soon(read_one)
        await anyio.wait_all_tasks_blocked()
        reply.nudge()
    assert batches == [[]]
    assert reply.taken == 0


async def test_events_waiting_go_first_and_settle_the_nudge() -> None:
    reply: ReplySlot[str] = ReplySlot("r")
    reply.put(delta("a"))
    reply.nudge()
    assert await reply.__anext__() == delta("a")
    assert reply.taken == 1
    # The nudge was for a quiet reader; this one has just read, so it waits for the next events.
    with anyio.move_on_after(0.05) as waited:
        await reply.__anext__()
    assert waited.cancelled_caught


async def test_a_nudge_does_not_hide_the_end() -> None:
    reply: ReplySlot[str] = ReplySlot("r")
    reply.nudge()
    reply.finish(SUMMARY)
    with pytest.raises(StopAsyncIteration):
        await reply.__anext__()
