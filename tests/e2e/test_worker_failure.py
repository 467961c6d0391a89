"""A bug in a worker's model thread: the worker's rows fail at once, its traceback and exit status reach the log.

The model thread is the one part whose failure may end a worker (pipeline/actor.py). Nothing a request sends
can make it fail, so the fault is put there from outside the code under test: a `sitecustomize` on the
server's `PYTHONPATH` makes `GenerationGateway._step` raise once a row asks for `BUG_TOKENS` tokens. Forked
workers inherit it from the front, which imports the module; spawned ones import it themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests import loopback
from tests.conftest import ServerFactory
from tests.e2e.workers import wait_ready

pytestmark = pytest.mark.slow

BUG_TOKENS = 7
_SITECUSTOMIZE = f"""
import importlib.abc
import importlib.machinery
import sys


class _Fault(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "stages.model_thread.gateway":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            step = module.GenerationGateway._step

            def failing(self, generator):
                if any(row.prepared.max_tokens == {BUG_TOKENS} for row in self._batch.rows.values()):
                    raise RuntimeError("a bug in the model thread")
                return step(self, generator)

            module.GenerationGateway._step = failing

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Fault())
"""


@pytest.mark.parametrize("fork", ["auto", "off"], ids=["forked", "spawned"])
def test_a_failing_model_thread_fails_its_rows_and_logs_why(
    server_factory: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork: str
) -> None:
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = server_factory(private=True, worker_fork=fork, worker_restart_backoff="0.05")
    worker = wait_ready(server)
    client = server.client()
    with pytest.raises(openai.InternalServerError) as failed:
        client.completions.create(model="m", prompt="Hi", max_tokens=BUG_TOKENS, temperature=0)
    assert failed.value.code == "worker_lost", failed.value.body
    wait_ready(server, other_than=worker)
    (exited,) = [json.loads(line) for line in server.logs().splitlines() if '"worker.exited"' in line]
    # Its own exit, with the exception's traceback, not a kill that cut it short.
    assert exited["pid"] == worker and exited["status"] == "exit status 1", exited
    assert "RuntimeError: a bug in the model thread" in exited["stderr"], exited
    assert "GenerationGateway" not in failed.value.message
    # The restarted worker serves every other request.
    completion = client.completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
    assert completion.usage is not None and completion.usage.completion_tokens == 2
    assert loopback.get(f"{server.base_url}/health", timeout=10).json()["status"] == "ok"
