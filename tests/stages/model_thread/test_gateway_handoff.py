"""stages/model_thread/gateway.py over stages/model_thread/handoff.py, on the tiny demo model: a stalled sink bounds
the thread.

Nothing reads the step channel for a while: the model thread runs ahead
by at most `steps_ahead` steps (their tokens held on the crossing), then
waits; once the sink reads again every row gets exactly the tokens a run
that was never stalled gives, greedy and seeded.
"""

from __future__ import annotations

from functools import partial

import anyio
import pytest

from pipeline.channels import Channel, open_channel
from pipeline.requests import Sampling
from stages.cache.disk import SpillJob
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import read_model_shape
from stages.messages import Abort, Prepared, StepOutputs
from stages.model_thread.gateway import GenerationGateway
from stages.models.loading import ModelInfo, load_weights
from tests.stages.cache.test_prompt_cache_gateway import EOS, GREEDY, Harness, Run, _until_done, model_info, row  # noqa: F401

STEPS_AHEAD = 2
SEEDED = Sampling(temperature=0.9, seed=5, logit_bias={0: -100.0, 2: -100.0})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def rows(sampling: Sampling) -> list[Prepared]:
    return [row(f"r{i}", tuple(range(10 + 40 * i, 50 + 40 * i)), max_tokens=30, sampling=sampling) for i in range(3)]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_a_stalled_sink_holds_the_thread_at_the_bound(model_info: ModelInfo, sampling: Sampling) -> None:
    expected = await Harness(model_info, None).run(rows(sampling))
    inbox: Channel[Prepared] = open_channel(16, name="gateway")
    control: Channel[Abort] = open_channel(4, name="control")
    # No buffer: a step is delivered only when the reader takes it.
    steps: Channel[StepOutputs] = open_channel(0, name="steps")
    spills: Channel[SpillJob] = open_channel(4, name="spills")
    gateway = GenerationGateway(
        inbox=inbox.receive,
        control=control.receive,
        aborts=control.send,
        out=steps.send,
        spills_out=spills.send,
        spills_in=spills.receive,
        load=partial(load_weights, model_info),
        eos_ids=EOS,
        max_batch=4,
        prefill_step_size=64,
        steps_ahead=STEPS_AHEAD,
        scheduler=KvScheduler(read_model_shape(model_info.path, model_info.context_window), 1 << 30),
    )
    wave = rows(sampling)
    run = Run()
    with anyio.fail_after(60), steps.receive, inbox.send:
        async with anyio.create_task_group() as group:
            await group.start(gateway.run)
            for item in wave:
                inbox.send.send_nowait(item)
            while gateway.statistics().handoff.steps_undelivered < STEPS_AHEAD:
                await anyio.sleep(0.01)
            await anyio.sleep(0.5)
            stalled = gateway.statistics()
            # Undelivered: STEPS_AHEAD steps; computed, waiting to be handed over: one more.
            assert stalled.generated_tokens <= (STEPS_AHEAD + 1) * len(wave)
            assert stalled.handoff.steps_undelivered_max == STEPS_AHEAD
            await _until_done(steps, run, {r.request_id for r in wave}, control, {})
            inbox.send.close()
    for r in wave:
        assert run.tokens(r.request_id) == expected.tokens(r.request_id) and len(run.tokens(r.request_id)) == 30
    final = gateway.statistics()
    assert final.handoff.steps_undelivered_max == STEPS_AHEAD and final.handoff.loop_wait_s > 0
