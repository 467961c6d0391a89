"""A real worker process on its private socket: taken by its first frame, serving the front's memory plan, drained.

What the front's supervisor (stages/remote/supervisor.py) says to a worker, said here frame by frame to a spawned
`python -m workers.main`, so each promise of the crossing is seen on the socket itself (issue #38):
- the lease: a started worker waits, imported, until its first frame gives it an engine's settings and the front's
  start-up decisions (a spare is such a worker; stages/remote/spare.py);
- the memory: the worker serves the plan the front sent, even one it would not have made itself;
- the drain: `CloseIn` lets the rows the worker holds finish, then the worker exits of its own accord, status 0.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import attrs
import msgspec
import pytest

from pipeline.requests import GenerationParams, Sampling
from pipeline.settings import Settings
from stages.remote.crossing import (
    BeatOut,
    CloseIn,
    ReadyOut,
    RowIn,
    SettingsIn,
    StatsIn,
    StepOut,
    ToFront,
)
from stages.remote.frames import FrameReader, FrameWriter
from stages.remote.process import start_worker
from tests.workers.test_model import front_start

pytestmark = pytest.mark.slow
_TOKENS = 24


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _until(reader: FrameReader[ToFront], kind: type) -> object:
    with anyio.fail_after(120):
        while not isinstance(frame := await reader.receive(), kind):
            pass
    return frame


async def test_a_worker_is_leased_serves_the_fronts_plan_and_drains_on_its_socket(tiny_model: Path) -> None:
    settings = Settings(demo_model="tiny")
    start = front_start(settings)
    # A KV budget the worker's own plan would not have chosen: only the front's plan can give it.
    sent_budget = start.fit.memory.usable_bytes // 3
    memory = attrs.evolve(start.fit.memory, usable_bytes=sent_budget)
    start = msgspec.structs.replace(start, fit=attrs.evolve(start.fit, memory=memory))
    worker = await start_worker(connect_timeout=60)
    try:
        reader: FrameReader[ToFront] = FrameReader(worker.stream, ToFront)
        writer = FrameWriter(worker.stream)
        # Leased: nothing comes from a worker until its first frame names its engine.
        with anyio.move_on_after(0.5):
            unasked = await reader.receive()
            pytest.fail(f"a worker spoke before its first frame: {unasked!r}")
        values = attrs.asdict(attrs.evolve(settings, api_key=None))
        await writer.send(SettingsIn(values=values, start=start))
        ready = await _until(reader, ReadyOut)
        assert isinstance(ready, ReadyOut) and ready.pid == worker.pid

        await writer.send(StatsIn())
        beat = await _until(reader, BeatOut)
        assert isinstance(beat, BeatOut) and beat.gateway is not None
        assert beat.gateway.kv_budget_bytes == sent_budget

        params = GenerationParams(max_tokens=_TOKENS, sampling=Sampling(temperature=0.0), ignore_eos=True)
        row = RowIn(request_id="r1", trace_id="t1", prompt_tokens=[1, 2, 3, 4], max_tokens=_TOKENS, params=params)
        await writer.send(row)
        await writer.send(CloseIn())
        tokens: list[int] = []
        finish = None
        while finish is None:
            step = await _until(reader, StepOut)
            assert isinstance(step, StepOut) and not step.failed
            for delta in step.deltas:
                tokens.extend(delta.new_token_ids)
                finish = delta.finish or finish
        # Drained, not cut: the row held when CloseIn came ran to its length.
        assert len(tokens) == _TOKENS and finish.value == "length"
        with anyio.fail_after(30):
            await worker.process.wait()
        assert worker.process.returncode == 0
    finally:
        with anyio.CancelScope(shield=True):
            await worker.end(1.0)
