"""stages/model_thread/gateway.py: a row that fails while it is admitted fails alone; the batch goes on."""

from __future__ import annotations

from functools import partial

import anyio
import attrs
import pytest
import structlog.testing

from pipeline.channels import Channel, open_channel
from pipeline.errors import ErrorKind, RequestError
from stages.cache.disk import SpillJob
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import read_model_shape
from stages.messages import Abort, CompiledConstraint, Prepared, StepOutputs
from stages.model_thread.gateway import GenerationGateway
from stages.models.loading import ModelInfo, load_weights

# model_info is that module's fixture, shared here.
from tests.stages.cache.test_prompt_cache_gateway import EOS, SYSTEM, Run, _until_done, model_info, row  # noqa: F401


class BrokenMatcher:
    """A grammar matcher whose copy fails: a bug met while admitting this one row."""

    def deep_copy(self) -> object:
        raise RuntimeError("matcher internals")


async def test_a_row_failing_at_admission_fails_alone(model_info: ModelInfo) -> None:
    """The broken row's reply gets a 500 at the next crossing; the row beside it runs to the end."""
    inbox: Channel[Prepared] = open_channel(4, name="gateway")
    control: Channel[Abort] = open_channel(4, name="control")
    steps: Channel[StepOutputs] = open_channel(64, name="steps")
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
        scheduler=KvScheduler(read_model_shape(model_info.path, model_info.context_window), 1 << 30),
    )
    bad = attrs.evolve(row("bad", SYSTEM[:8]), constraint=CompiledConstraint(prototype=BrokenMatcher()))  # type: ignore[arg-type]
    good = row("good", SYSTEM[:8])
    run = Run()
    with structlog.testing.capture_logs() as logs, anyio.fail_after(60), steps.receive:
        async with anyio.create_task_group() as group:
            await group.start(gateway.run)
            inbox.send.send_nowait(bad)
            inbox.send.send_nowait(good)
            await _until_done(steps, run, {"good"}, control, {})
            inbox.send.close()
    assert sum(len(d.new_token_ids) for s in run.steps for d in s.deltas if d.request_id == "good") == 12
    assert all(d.request_id == "good" for s in run.steps for d in s.deltas)
    with pytest.raises(RequestError) as caught:
        await bad.reply.accepted()
    assert (caught.value.kind, caught.value.code) == (ErrorKind.INTERNAL, "internal_error")
    assert [e["request_id"] for e in logs if e["event"] == "request.internal_error"] == ["bad"]
