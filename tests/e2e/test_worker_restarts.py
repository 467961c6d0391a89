"""A worker's restarts: the back-off that grows while restarts fail, the `failed` state, the front's memory over many.

A worker that crashes at each start is put there from outside the code under test, as in
`tests/e2e/test_worker_failure.py`: a `sitecustomize` on the server's `PYTHONPATH` makes
`WorkerHost.serve`, the worker's first step once it has its settings, exit the process while a flag file
exists. The first worker starts before the flag is made; every restart after it dies before it is ready.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.workers import front_pid, model_state, rss_kib, wait_ready

pytestmark = pytest.mark.slow

# stages/remote/supervisor.py: restarts in a row that serve nothing, after which the model is failed.
MAX_RESTARTS = 8
BACKOFF_S = 0.01
# Forced restarts the front's memory is measured over, and the growth allowed over the last ten of them.
RESTARTS = 50
RSS_BOUND_KIB = 32 * 1024
_SITECUSTOMIZE = """
import importlib.abc
import importlib.machinery
import os
import sys

CRASH_FLAG = {flag!r}


class _Fault(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "workers.host":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            serve = module.WorkerHost.serve

            async def crashing(self, stream, reader):
                if os.path.exists(CRASH_FLAG):
                    print("a crash at the worker's start", file=sys.stderr, flush=True)
                    os._exit(3)
                return await serve(self, stream, reader)

            module.WorkerHost.serve = crashing

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Fault())
"""


def log_lines(server: Server, event: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in server.logs().splitlines() if f'"{event}"' in line]


def seconds_between(lines: list[dict[str, object]]) -> list[float]:
    stamps = [datetime.fromisoformat(str(line["timestamp"])) for line in lines]
    return [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(stamps)]


def test_failed_restarts_back_off_longer_each_time_until_the_model_is_failed(
    server_factory: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed, then every restart dying at its start: each wait before a start is twice the last, the log's
    `worker.restart` lines are at least that far apart, and after 8 restarts the model is `failed` in /health and
    /v1/models."""
    flag = tmp_path / "crash"
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(flag=str(flag)))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = server_factory(private=True, worker_restart_backoff=str(BACKOFF_S))
    worker = wait_ready(server)
    flag.touch()
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while model_state(server)["state"] != "failed":
        assert time.monotonic() < deadline, model_state(server)
        time.sleep(0.1)

    assert model_state(server)["restarts"] == MAX_RESTARTS
    (card,) = loopback.get(f"{server.v1}/models", timeout=10).json()["data"]
    assert card["state"] == "failed", card
    assert loopback.get(f"{server.base_url}/health", timeout=10).status_code == 503
    restarts = log_lines(server, "worker.restart")
    delays = [float(str(line["delay_s"])) for line in restarts]
    assert delays == pytest.approx([BACKOFF_S * 2**n for n in range(MAX_RESTARTS)]), delays
    # Each start after the first died of the fault, not of something else.
    exited = log_lines(server, "worker.exited")
    assert len(exited) == MAX_RESTARTS + 1
    assert all("a crash at the worker's start" in str(line["stderr"]) for line in exited[1:]), exited
    # A line's wait is slept before the next start, whose crash then logs the next line: the gap is at least the
    # wait, however slow the machine (no upper bound but the cap's, which a loaded machine could pass).
    for gap, delay in zip(seconds_between(restarts), delays, strict=False):
        assert gap >= delay, (seconds_between(restarts), delays)


def test_the_fronts_memory_stays_flat_over_50_forced_restarts(server_factory: ServerFactory) -> None:
    """50 kill -9s of the worker, each restart answering a request: the front's RSS over the last ten restarts
    stays within 32 MiB of its RSS after the tenth."""
    server = server_factory(private=True, worker_restart_backoff="0.05")
    worker = wait_ready(server)
    front = front_pid(worker)
    client = server.client()
    samples = []
    for _ in range(RESTARTS):
        os.kill(worker, signal.SIGKILL)
        worker = wait_ready(server, other_than=worker)
        # A request served resets the failed-restart count, so the back-off stays at its first step.
        completion = client.completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
        assert completion.usage is not None and completion.usage.completion_tokens == 2
        samples.append(rss_kib(front))
    assert front_pid(worker) == front and model_state(server)["restarts"] == RESTARTS
    # The first restarts warm the front's caches; the later ones must add nothing that grows.
    assert max(samples[-10:]) - samples[9] < RSS_BOUND_KIB, samples
