"""Joining the group, loading this rank's slice, and aborting the group.

`join` starts MLX's distributed backend as `mlx.launch` configured it (ring
over TCP, or JACCL over Thunderbolt RDMA), then wires the heartbeats:
rank 0 listens on a free port and tells the followers which in the first
collective; they reach it at rank 0's address in the launcher's host
file. Every rank loads the model with mlx-lm's own sharding: tensor
parallel (`model.shard`: each rank holds 1/N of every layer's heads and
MLP rows) or pipeline parallel (`model.model.pipeline`: each rank holds a
run of layers), as `mlx_lm.utils.sharded_load` does from a local folder.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import structlog

from stages.shard.launcher import watch_launcher
from stages.shard.liveness import Beating, Heartbeats, RankStatus
from stages.shard.replicated import ReplicatedGenerator, StepLog

log = structlog.get_logger(stage="shard")

MODES = ("tensor", "pipeline")


@attrs.define
class Cluster:
    group: mx.distributed.Group
    mode: str
    # Rank 0 only: the followers' heartbeats.
    heartbeats: Heartbeats | None
    # Followers only: this rank's heartbeat thread.
    beating: Beating | None
    # The sockets the backend opened (ring): shutting them down fails a collective that waits on a lost rank.
    _backend_sockets: list[int]
    step_log: StepLog = attrs.field(factory=StepLog)
    # The slice's weights were dequantized to float32 (rank 0's plan, `load`).
    float32_weights: bool = False
    generator: ReplicatedGenerator | None = None

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())

    def load(self, path: Path, *, float32: bool = False) -> Any:
        """This rank's slice of the model, weights evaluated. Call on the model thread.

        `float32`: rank 0's plan serves quantized weights dequantized (the CPU backend; stages/models/weights.py).
        Every rank takes rank 0's word for it, sent in a collective: only rank 0 plans the memory, and ranks
        whose slices were of two forms would add float32 partial sums to bfloat16 ones.
        """
        from mlx_lm.utils import dequantize_model, load_model

        said = mx.array(int(float32) if self.rank == 0 else 0)
        self.float32_weights = bool(mx.distributed.all_sum(said, group=self.group, stream=mx.cpu).item())
        model, _ = load_model(path, lazy=True, strict=False)
        if self.float32_weights:
            # Before the slicing, lazily: each rank evaluates only its slice of the float32 weights.
            model = dequantize_model(model)
            model.set_dtype(mx.float32)
        if self.mode == "tensor":
            if not hasattr(model, "shard"):
                raise ValueError(f"{path.name}: mlx-lm has no tensor-parallel sharding for this architecture")
            model.shard(self.group)
        else:
            inner: Any = getattr(model, "model", None)
            if not hasattr(inner, "pipeline"):
                raise ValueError(f"{path.name}: mlx-lm has no pipeline sharding for this architecture")
            inner.pipeline(self.group)
        mx.eval(model.parameters())
        # Every rank holds its slice before the first step.
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=self.group, stream=mx.cpu))
        log.info("shard.loaded", rank=self.rank, size=self.size, mode=self.mode, float32=self.float32_weights)
        return model

    def make_generator(self, model: Any, **config: Any) -> ReplicatedGenerator:
        self.generator = ReplicatedGenerator(model, self.group, self.step_log, **config)
        return self.generator

    def ranks(self) -> list[RankStatus]:
        assert self.heartbeats is not None
        steps = self.generator.steps if self.generator is not None else 0
        return self.heartbeats.ranks(steps)

    def abort(self) -> None:
        """Fail whatever collective waits on a lost rank, now and from now on (ring only)."""
        for fd in self._backend_sockets:
            try:
                with socket.socket(fileno=os.dup(fd)) as connection:
                    connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        log.error("shard.aborted", rank=self.rank, sockets=len(self._backend_sockets))


def join(mode: str, *, timeout: float) -> Cluster:
    """Join the group `mlx.launch` set up; blocks until every rank has joined."""
    if mode not in MODES:
        raise ValueError(f"unknown shard mode {mode!r}; choose from {MODES}")
    # A rank outliving its launcher would go on holding the model (and rank 0 serving HTTP) alone.
    watch_launcher()
    before = _sockets()
    group = mx.distributed.init(strict=True)
    backend_sockets = sorted(_sockets() - before)
    rank, size = group.rank(), group.size()
    if size < 2:
        raise ValueError("sharding needs at least two ranks: start the server with mlx.launch")
    # Rank 0's heartbeat port and a token only the group knows, in the group's first collective.
    token = secrets.randbits(31) if rank == 0 else 0
    heartbeats = Heartbeats(size=size, timeout=timeout, token=str(token)) if rank == 0 else None
    port = heartbeats.listen() if heartbeats is not None else 0
    shared = mx.distributed.all_sum(mx.array([port, token], dtype=mx.int64), group=group, stream=mx.cpu).tolist()
    port, token = int(shared[0]), int(shared[1])  # type: ignore[index, arg-type]
    beating = None
    if rank != 0:
        beating = Beating(rank=rank)
        beating.start(coordinator(), port, str(token))
    log.info("shard.joined", rank=rank, size=size, mode=mode, heartbeat_port=port)
    cluster = Cluster(group=group, mode=mode, heartbeats=heartbeats, beating=beating, backend_sockets=backend_sockets)
    if heartbeats is not None:
        cluster.step_log.doorbell = heartbeats.ring
    return cluster


def coordinator() -> str:
    """Rank 0's address, as the launcher's host file gives it (ring: "ip:port"; JACCL: "ips" or "ssh")."""
    override = os.environ.get("MLX_RELAY_SHARD_COORDINATOR")
    if override:
        return override
    hostfile = os.environ.get("MLX_HOSTFILE")
    if not hostfile:
        return "127.0.0.1"
    first = json.loads(Path(hostfile).read_text())[0]
    if isinstance(first, list):
        return str(first[0]).rsplit(":", 1)[0]
    if isinstance(first, dict):
        ips = first.get("ips") or [first.get("ssh", "127.0.0.1")]
        return str(ips[0])
    return str(first).rsplit(":", 1)[0]


def _sockets() -> set[int]:
    found = set()
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else _fds():
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                found.add(int(name))
        except OSError:
            continue
    return found


def _fds() -> list[str]:
    # macOS has no /proc: try the low descriptors.
    return [str(fd) for fd in range(3, 1024)]
