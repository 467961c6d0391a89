"""The fleet's own admission, in process with real tiny engines: the load queue's bound, and a 503 while
the memory a model needs is held by a model in use (never a load into an out-of-memory)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from fleet.fleet import Fleet
from fleet.model_host import State
from fleet.spec import KvSpec, ModelSpec
from pipeline.errors import RequestError
from pipeline.settings import Settings

MiB = 2**20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def fleet(tiny_model: Path) -> AsyncIterator[Fleet]:
    """Two tiny models of 40 MiB each under a budget of 60 MiB, at most one request waiting for a load."""
    specs = tuple(
        ModelSpec(name=name, source=str(tiny_model), kv=KvSpec(memory_budget=40 * MiB)) for name in ("t1", "t2")
    )
    settings = Settings(memory_budget=60 * MiB, max_pending=1, retry_after=3.0)
    async with anyio.create_task_group() as group:
        served: Fleet = await group.start(Fleet(settings=settings, specs=specs, several=True).run)
        yield served
        await served.drain(10)
        group.cancel_scope.cancel()


async def test_past_the_load_queue_s_bound_a_request_is_a_503_with_retry_after(fleet: Fleet) -> None:
    refused: list[RequestError] = []

    async def use() -> None:
        try:
            async with fleet.use("t1"):
                pass
        except RequestError as error:
            refused.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(use)
        group.start_soon(use)
    assert [(error.status, error.code, error.retry_after) for error in refused] == [(503, "model_loading", 3.0)]
    assert fleet.hosts["t1"].state is State.READY and fleet.hosts["t1"].waiting == 0


async def test_a_model_in_use_is_not_evicted_and_the_next_one_waits(fleet: Fleet) -> None:
    async with fleet.use("t1"):
        with pytest.raises(RequestError) as refused:
            async with fleet.use("t2"):
                pass
        assert refused.value.status == 503 and refused.value.retry_after == 3.0
        assert "models in use hold the rest (t1)" in refused.value.message
    # Idle now: t1 makes room.
    async with fleet.use("t2"):
        assert (fleet.hosts["t1"].state, fleet.hosts["t2"].state) == (State.UNLOADED, State.READY)
