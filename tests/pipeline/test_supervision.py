"""pipeline/supervision.py: the supervisor owns the actors one level down
(docs/STYLE.md, "One owner for the tree", "Readiness from downstream", "Failures are values, crashes are fatal").

The actors here are small stand-ins written against the `Actor` protocol:
the supervisor is LLM-free, so it is tested with actors that only wait,
crash or return, and record what happened to them.
"""

from __future__ import annotations

import anyio
import attrs
import pytest
import structlog.testing
from anyio.abc import TaskStatus

from pipeline.supervision import Actor, Supervisor


class Crash(Exception):
    pass


@attrs.define
class Recorder:
    events: list[str] = attrs.field(factory=list)


@attrs.define
class WaitingActor:
    """Signals readiness, then runs until cancelled or `stop` is set."""

    name: str
    log: Recorder
    stop: anyio.Event = attrs.field(factory=anyio.Event)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.log.events.append(f"{self.name}.started")
        task_status.started()
        try:
            await self.stop.wait()
            self.log.events.append(f"{self.name}.returned")
        except anyio.get_cancelled_exc_class():
            self.log.events.append(f"{self.name}.cancelled")
            raise


@attrs.define
class CrashingActor:
    """Crashes, after signalling readiness unless `before_ready`."""

    log: Recorder
    before_ready: bool = False
    trigger: anyio.Event = attrs.field(factory=anyio.Event)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self.before_ready:
            raise Crash("before ready")
        task_status.started()
        await self.trigger.wait()
        self.log.events.append("crasher.raising")
        raise Crash("after ready")


def supervisor(actors: list[Actor], log: Recorder) -> Supervisor:
    return Supervisor(actors=actors, on_stop=lambda: log.events.append("on_stop"))


async def test_actors_start_in_order_and_ready_means_all_are_ready() -> None:
    """Actors start one by one in the given order; the supervisor is ready only after the last."""
    log = Recorder()
    actors = [WaitingActor(name, log) for name in ("sink", "gateway", "parse")]
    sup = supervisor(list(actors), log)
    async with anyio.create_task_group() as group:
        await group.start(sup.run)
        log.events.append("ready")
        assert sup.running and not sup.dead
        group.cancel_scope.cancel()
    assert log.events[:4] == ["sink.started", "gateway.started", "parse.started", "ready"]


async def test_a_crash_after_start_marks_dead_cancels_siblings_and_returns() -> None:
    """A running actor's crash cancels its siblings, marks the engine dead, calls on_stop, and run returns."""
    log = Recorder()
    sibling, crasher = WaitingActor("sibling", log), CrashingActor(log)
    sup = supervisor([sibling, crasher], log)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as group:
            await group.start(sup.run)
            assert sup.running
            crasher.trigger.set()
        # The outer group exits normally: the crash did not escape the supervisor.
    assert sup.dead and not sup.running
    assert log.events == ["sibling.started", "crasher.raising", "sibling.cancelled", "on_stop"]
    crashes = [entry for entry in logs if entry["event"] == "engine.crashed"]
    assert len(crashes) == 1
    assert crashes[0]["log_level"] == "error" and crashes[0]["started"] is True


async def test_a_crash_before_ready_is_raised() -> None:
    """A server that cannot start says so: a crash during start-up propagates out of run()."""
    log = Recorder()
    sup = supervisor([WaitingActor("sink", log), CrashingActor(log, before_ready=True)], log)
    with structlog.testing.capture_logs(), pytest.RaisesGroup(Crash, flatten_subgroups=True):
        async with anyio.create_task_group() as group:
            await group.start(sup.run)
    assert sup.dead and not sup.running
    assert log.events == ["sink.started", "sink.cancelled", "on_stop"]


async def test_actors_that_return_stop_the_tree_cleanly() -> None:
    """When every actor returns (their inboxes closed), the engine stopped but is not dead."""
    log = Recorder()
    actors = [WaitingActor("a", log), WaitingActor("b", log)]
    sup = supervisor(list(actors), log)
    async with anyio.create_task_group() as group:
        await group.start(sup.run)
        for actor in actors:
            actor.stop.set()
    assert not sup.dead and not sup.running
    # trio wakes the two actors in either order; on_stop comes after both.
    assert log.events[:2] == ["a.started", "b.started"]
    assert sorted(log.events[2:4]) == ["a.returned", "b.returned"]
    assert log.events[4:] == ["on_stop"]


async def test_cancelling_the_owner_stops_the_tree_without_marking_dead() -> None:
    """Shutdown by cancellation is not a crash: on_stop runs, dead stays False."""
    log = Recorder()
    sup = supervisor([WaitingActor("a", log)], log)
    async with anyio.create_task_group() as group:
        await group.start(sup.run)
        group.cancel_scope.cancel()
    assert not sup.dead and not sup.running
    assert log.events == ["a.started", "a.cancelled", "on_stop"]


async def test_not_running_before_start() -> None:
    """A supervisor that has not run is neither running nor dead."""
    sup = supervisor([], Recorder())
    assert not sup.running and not sup.dead
