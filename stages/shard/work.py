"""Exclusive model work (embeddings, scores) on a sharded model: every rank runs the same forward pass.

A forward pass of a sharded model is itself a run of collectives, so it
must run on every rank at once. Rank 0's exclusive queue (`stages/model_thread/exclusive.py`)
runs each chunk through `ReplicatedWork`: it sends the step log at once,
ending with the chunk (the job's inputs with its first chunk, then only
how many tokens to run), and runs the chunk; each follower builds the
same work from those inputs and runs the same chunk (`WorkReplay`). The
work is deterministic given its inputs and chunk sizes, so every rank's
forward passes are the same, and the result is taken on rank 0.

The chunks run on the generator's stream, after the step already queued
there, so their collectives come in the same order on every rank. Work
of a kind this module does not know is refused (it could not be
replayed).
"""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx
import structlog

from pipeline.errors import invalid
from stages.model_thread.embed import EmbedWork, ScoreWork
from stages.model_thread.exclusive import Job, Work
from stages.shard.replicated import Desync, StepLog

log = structlog.get_logger(stage="shard")


def describe(work: object) -> dict[str, Any]:
    """What a follower needs to build the same work."""
    if isinstance(work, EmbedWork):
        return {"kind": "embed", "inputs": [list(tokens) for tokens in work.inputs], "pooling": work.pooling}
    if isinstance(work, ScoreWork):
        return {"kind": "score", "inputs": [list(tokens) for tokens in work.inputs], "yes": work.yes, "no": work.no}
    raise invalid(
        f"{type(work).__name__} is not served while the model is sharded over several ranks",
        param="model",
        code="model_not_supported",
    )


def build(spec: dict[str, Any]) -> Work[Any]:
    if spec["kind"] == "embed":
        return EmbedWork(inputs=spec["inputs"], pooling=spec["pooling"])
    if spec["kind"] == "score":
        return ScoreWork(inputs=spec["inputs"], yes=spec["yes"], no=spec["no"])
    raise Desync(f"unknown exclusive work {spec['kind']!r}")


@attrs.define
class ReplicatedWork:
    """Rank 0's way to run a chunk of exclusive work: every other rank runs it too."""

    step_log: StepLog
    _job: Job[Any] | None = attrs.field(default=None, init=False)
    _number: int = attrs.field(default=0, init=False)

    def __call__(self, job: Job[Any], model: Any, units: int) -> int:
        first = job is not self._job
        spec = describe(job.work) if first else None
        if first:
            self._job, self._number = job, self._number + 1
        self.step_log.send({"op": "work", "job": self._number, "spec": spec, "units": units})
        assert self.step_log.channel is not None
        with mx.stream(self.step_log.channel.stream):
            ran: int = job.work.run_chunk(model, units)
        return ran


@attrs.define
class WorkReplay:
    """A follower's side: the job rank 0 is running, and its chunks."""

    _work: Work[Any] | None = attrs.field(default=None, init=False)
    _job: int = attrs.field(default=0, init=False)

    def run(self, model: Any, op: dict[str, Any], stream: Any) -> None:
        if op["spec"] is not None:
            self._work, self._job = build(op["spec"]), op["job"]
        if self._work is None or self._job != op["job"]:
            raise Desync(f"rank 0 runs a chunk of job {op['job']}, this rank holds {self._job}")
        try:
            with mx.stream(stream):
                self._work.run_chunk(model, op["units"])
        except Exception as error:  # noqa: BLE001 -- rank 0 logs the failure; this rank only drops the job
            # Rank 0's chunk failed the same way (same inputs, same code): its job fails, and it sends no more chunks.
            log.warning("follower.work_failed", job=op["job"], error=type(error).__name__)
            self._work = None
        else:
            if self._work.remaining() == 0:
                self._work = None
