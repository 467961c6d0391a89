"""workers/model.py: the worker's model side plans on the memory figure its front measured, without probing again."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.settings import Settings
from stages.kv import machine
from workers.model import open_model


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_plan_takes_the_fronts_figure_and_probes_nothing(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def probe() -> float:
        raise AssertionError("the worker measured the bandwidth again")

    monkeypatch.setattr(machine, "_measure_bandwidth", probe)
    model = await open_model(Settings(demo_model="tiny"), measured_bandwidth=12.5e9)
    assert model.side.fit.machine.bandwidth_bytes_per_s == 12.5e9
    assert model.side.fit.machine.bandwidth_source == "memcpy"
    assert model.side.fit.decode_tokens_per_s.empty_context > 0
