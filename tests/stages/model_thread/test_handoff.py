"""stages/model_thread/handoff.py: the crossing between the model thread and the loop, with a stand-in thread (no MLX).

The invariants: the thread never waits for the loop while fewer than
`depth` steps are undelivered, and waits once that many are (so a stalled
sink holds at most `depth` steps here); parcels arrive in order; rows cross
only into free slots, all that arrived together at once; the thread waits
with no row, and ends when the inbox closes or its host is cancelled.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.to_thread
import pytest

from pipeline.channels import Channel, open_channel
from stages.messages import Abort, Prepared, StepOutputs
from stages.model_thread import handoff as handoff_module
from stages.model_thread.handoff import Handoff, Parcel
from stages.model_thread.rows import Intake
from tests.stages.cache.test_prompt_cache_gateway import row


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def parcel(step: int) -> Parcel:
    return Parcel(outputs=StepOutputs(admitted=(), deltas=(), stepped_at=float(step)))


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await anyio.sleep(0.01)


class Crossing:
    def __init__(self, depth: int = 2, max_rows: int = 4) -> None:
        self.handoff = Handoff(depth=depth, max_rows=max_rows)
        self.inbox: Channel[Prepared] = open_channel(16, name="gateway")
        self.control: Channel[Abort] = open_channel(4, name="control")
        self.delivered: list[float] = []
        self.gate = anyio.Event()
        self.gate.set()

    async def send(self, p: Parcel) -> None:
        await self.gate.wait()
        self.delivered.append(p.outputs.stepped_at)

    async def run(self, thread: Callable[[], None]) -> None:
        async def in_thread() -> None:
            await anyio.to_thread.run_sync(thread)

        async with self.inbox.receive, self.control.receive, self.control.send, self.inbox.send:
            await self.handoff.run(
                in_thread, inbox=self.inbox.receive, control=self.control.receive, bind=lambda r: None, send=self.send
            )


@pytest.fixture
async def crossing(request: pytest.FixtureRequest) -> Crossing:
    """A crossing (depth 2, four slots) with a stand-in sink; `indirect` parametrization changes either."""
    return Crossing(**getattr(request, "param", {}))


async def test_a_stalled_sink_holds_at_most_depth_steps(crossing: Crossing) -> None:
    """With delivery stalled the thread hands over `depth` steps and waits; released, all arrive in order."""
    crossing.gate = anyio.Event()
    handed: list[int] = []

    def thread() -> None:
        crossing.handoff.take(held=0)
        for step in range(6):
            crossing.handoff.hand_over(parcel(step), held=1)
            handed.append(step)
        crossing.handoff.hand_over(None, held=0)
        assert crossing.handoff.take(held=0).closed

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(crossing.run, thread)
            crossing.inbox.send.send_nowait(row("a", (10, 11)))
            await until(lambda: crossing.handoff.statistics().steps_undelivered == 2)
            await anyio.sleep(0.3)
            # The third step is computed, and waits to be handed over.
            assert handed == [0, 1]
            crossing.gate.set()
            await until(lambda: len(handed) == 6)
            crossing.inbox.send.close()
    stats = crossing.handoff.statistics()
    assert crossing.delivered == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.steps_undelivered_max == 2 and stats.steps_undelivered == 0
    assert stats.loop_wait_s > 0


@pytest.mark.parametrize("crossing", [{"depth": 64}], indirect=True, ids=["depth64"])
async def test_the_thread_does_not_wait_while_delivery_keeps_up(crossing: Crossing) -> None:

    def thread() -> None:
        crossing.handoff.take(held=0)
        for step in range(50):
            crossing.handoff.hand_over(parcel(step), held=1)
        crossing.handoff.hand_over(None, held=0)
        assert crossing.handoff.take(held=0).closed

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(crossing.run, thread)
            crossing.inbox.send.send_nowait(row("a", (10, 11)))
            crossing.inbox.send.close()
    assert crossing.delivered == [float(step) for step in range(50)]
    assert crossing.handoff.statistics().loop_wait_s == 0.0


async def test_rows_cross_into_free_slots_only_and_together(crossing: Crossing) -> None:
    """Six rows at once, four slots: four cross in one intake; the rest once a row has left."""
    intakes: list[tuple[str, ...]] = []

    def thread() -> None:
        held = 0
        while not (intake := crossing.handoff.take(held=held)).closed:
            intakes.append(tuple(r.request_id for r in intake.admitted))
            aborted = {a.request_id for a in intake.aborts}
            held += len(intake.admitted) - len(aborted)
            # Each step one row finishes: its slot is free after the hand-over.
            held = max(0, held - 1)
            crossing.handoff.hand_over(parcel(len(intakes)), held=held)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(crossing.run, thread)
            for i in range(6):
                crossing.inbox.send.send_nowait(row(f"r{i}", (10, 11)))
            await until(lambda: sum(map(len, intakes)) == 6)
            crossing.inbox.send.close()
    assert intakes[0] == ("r0", "r1", "r2", "r3")
    assert [r for intake in intakes for r in intake] == [f"r{i}" for i in range(6)]


async def test_aborts_reach_the_thread_with_the_next_intake(crossing: Crossing) -> None:
    seen: list[str] = []

    def thread() -> None:
        held = 0
        while not seen:
            intake = crossing.handoff.take(held=held)
            held += len(intake.admitted)
            seen.extend(a.request_id for a in intake.aborts)
            crossing.handoff.hand_over(parcel(0), held=held)
        crossing.handoff.hand_over(None, held=0)
        assert crossing.handoff.take(held=0).closed

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(crossing.run, thread)
            crossing.inbox.send.send_nowait(row("a", (10, 11)))
            crossing.control.send.send_nowait(Abort(request_id="a"))
            await until(lambda: bool(seen))
            crossing.inbox.send.close()
    assert seen == ["a"]


async def test_a_host_cancel_ends_an_idle_thread(crossing: Crossing) -> None:
    ended = anyio.Event()

    def thread() -> None:
        try:
            assert crossing.handoff.take(held=0).closed
        finally:
            anyio.from_thread.run_sync(ended.set)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(crossing.run, thread)
            await anyio.sleep(0.1)
            group.cancel_scope.cancel()
    assert ended.is_set()
    assert crossing.handoff.statistics().idle_wait_s > 0


async def test_a_host_cancel_wakes_a_thread_waiting_for_delivery(
    crossing: Crossing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inbox closed, the thread waits on a stalled sink: the cancellation itself wakes it, not the backstop poll."""
    monkeypatch.setattr(handoff_module, "_POLL_S", 30.0)
    crossing.gate = anyio.Event()
    ended = anyio.Event()

    def thread() -> None:
        try:
            assert crossing.handoff.take(held=0).closed
            for step in range(8):
                crossing.handoff.hand_over(parcel(step), held=1)
        finally:
            anyio.from_thread.run_sync(ended.set)

    # Without the wake, the thread would sleep out the poll and the crossing end late: past this deadline.
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(crossing.run, thread)
            crossing.inbox.send.close()
            await until(lambda: crossing.handoff.statistics().loop_wait_s > 0)
            group.cancel_scope.cancel()
    assert ended.is_set()


async def test_a_nudge_wakes_an_idle_thread_with_an_empty_intake(crossing: Crossing) -> None:
    intakes: list[Intake] = []

    def thread() -> None:
        intakes.append(crossing.handoff.take(held=0))
        # The nudge is spent: the next idle take waits again, until the inbox closes.
        intakes.append(crossing.handoff.take(held=0))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(crossing.run, thread)
            await anyio.sleep(0.1)
            assert not intakes
            crossing.handoff.nudge()
            await until(lambda: len(intakes) == 1)
            assert not intakes[0].closed and not intakes[0].admitted
            await anyio.sleep(0.1)
            assert len(intakes) == 1
            crossing.inbox.send.close()
    assert intakes[1].closed
