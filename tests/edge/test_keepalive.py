"""edge/keepalive.py: one clock nudges the streams that have been quiet for an interval."""

from __future__ import annotations

import anyio
import attrs
import pytest

from edge.keepalive import TICKS, Keepalives
from pipeline.events import TextDelta
from stages.messages import Reply

pytestmark = pytest.mark.anyio


async def nudged(reply: Reply) -> bool:
    """Whether the reader would be woken now with an empty batch (a keepalive), rather than wait."""
    with anyio.move_on_after(0.01):
        return await reply.__anext__() == []
    return False


async def test_a_stream_quiet_for_a_whole_interval_is_nudged_once_an_interval() -> None:
    clock, reply = Keepalives(interval=1.0), Reply("r")
    with clock.watching(reply):
        for _ in range(TICKS - 1):
            clock.tick()
        assert not await nudged(reply)
        clock.tick()
        assert await nudged(reply)
        for _ in range(TICKS - 1):
            clock.tick()
        assert not await nudged(reply)
        clock.tick()
        assert await nudged(reply)


async def test_a_stream_that_reads_is_not_nudged() -> None:
    clock, reply = Keepalives(interval=1.0), Reply("r")
    with clock.watching(reply):
        for _ in range(3 * TICKS):
            reply.put([TextDelta(text="x")])
            assert await reply.__anext__() == [TextDelta(text="x")]
            clock.tick()
        assert not await nudged(reply)


async def test_a_stream_is_watched_only_inside_its_block() -> None:
    clock, reply = Keepalives(interval=1.0), Reply("r")
    with clock.watching(reply):
        pass
    for _ in range(2 * TICKS):
        clock.tick()
    assert not await nudged(reply)


async def test_the_clock_wakes_a_waiting_reader_after_about_an_interval() -> None:
    clock, reply = Keepalives(interval=0.2), Reply("r")
    async with anyio.create_task_group() as group:
        await group.start(clock.run)
        with clock.watching(reply):
            started = anyio.current_time()
            assert await reply.__anext__() == []
            waited = anyio.current_time() - started
        group.cancel_scope.cancel()
    # The first look comes up to a tick after the stream starts: a nudge after (TICKS - 1) to TICKS ticks (the
    # upper bound leaves a loaded machine's scheduling room; a clock that never nudged would hang here instead).
    assert 0.2 * (TICKS - 1) / TICKS <= waited < 1.0


@attrs.define
class CountingClock(Keepalives):
    ticks: int = attrs.field(default=0, init=False)

    def tick(self) -> None:
        self.ticks += 1
        super().tick()


async def test_the_clock_sleeps_while_no_stream_is_open_and_wakes_for_one() -> None:
    clock, reply = CountingClock(interval=0.04), Reply("r")
    async with anyio.create_task_group() as group:
        await group.start(clock.run)
        await anyio.sleep(0.2)
        assert clock.ticks == 0
        with clock.watching(reply):
            assert await reply.__anext__() == []
        assert clock.ticks >= TICKS
        # Its last stream closed, the clock goes back to sleep after at most the look it was waiting for.
        closed_at = clock.ticks
        await anyio.sleep(0.2)
        assert clock.ticks <= closed_at + 1
        group.cancel_scope.cancel()
