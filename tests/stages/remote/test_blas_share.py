"""stages/remote/blas_share.py: workers of a front with several models split the cores' BLAS threads between them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from stages.remote.blas_share import BLAS_SHARE, BlasShare
from stages.remote.process import start_worker

VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the BLAS threads are shared on Linux only")


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("unset")
def test_several_models_split_the_cores_and_one_model_keeps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    assert BlasShare(models=1).environment() == {}
    assert BlasShare(models=3).environment() == dict.fromkeys(VARIABLES, "5")
    # More models than cores: one thread each, never none.
    assert BlasShare(models=40).environment() == dict.fromkeys(VARIABLES, "1")
    assert BlasShare(models=3).describe() == "5 per worker (16 cores shared by 3 models)"


@pytest.mark.usefixtures("unset")
def test_a_thread_count_the_user_set_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    share = BlasShare(models=4)
    assert share.environment() == {}
    assert share.describe() == "from the environment: OMP_NUM_THREADS=6"


@pytest.mark.usefixtures("unset")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_started_worker_gets_the_share_in_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BLAS_SHARE, "models", 2)
    worker = await start_worker(connect_timeout=60.0)
    try:
        entries = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
        environ = dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)
    finally:
        await worker.end(0.0)
    expected = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert {name: environ.get(name) for name in VARIABLES} == dict.fromkeys(VARIABLES, expected)
