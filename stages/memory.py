"""Memory admission policy: what fits, computed before any work is admitted.

Pure arithmetic over the model's config, its weight files and the machine:
the KV bytes one token costs, what the weights and one prefill chunk take,
and so the largest context that can be served without the process running
out of memory. `plan` runs once at engine start; `KvLedger` is the
gateway's running account of the batch's reserved KV (model thread only).
Nothing here touches MLX: every figure is an estimate from the config, and
/fit shows the inputs so a reader can check it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs

# The share of RAM a server may plan for when no budget is set: the OS,
# the HTTP side and MLX's buffer cache need the rest (Metal's recommended
# working set on Apple silicon is about the same share).
_RAM_SHARE = 0.75
# The prompt cache may take at most this share of what the weights and a
# prefill chunk leave, so live requests always keep the larger part.
_PROMPT_CACHE_SHARE = 0.5
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Activations are float16/bfloat16 in most served models.
_DEFAULT_DTYPE_BYTES = 2
# Scores and activations of a prefill chunk are computed in float32.
_ACTIVATION_BYTES = 4
# Published memory bandwidth of Apple silicon, bytes/s: the decode bound.
_APPLE_BANDWIDTH = {
    "M1": 68e9, "M1 Pro": 200e9, "M1 Max": 400e9, "M1 Ultra": 800e9,
    "M2": 100e9, "M2 Pro": 200e9, "M2 Max": 400e9, "M2 Ultra": 800e9,
    "M3": 100e9, "M3 Pro": 150e9, "M3 Max": 400e9, "M3 Ultra": 819e9,
    "M4": 120e9, "M4 Pro": 273e9, "M4 Max": 546e9,
}  # fmt: skip
# 64 MiB: far past the CPU caches, and copied in ~20 ms.
_PROBE_BYTES = 64 << 20


class BudgetError(ValueError):
    """The memory budget cannot hold the model and one token of KV."""


@attrs.frozen(kw_only=True)
class Machine:
    ram_bytes: int
    chip: str | None
    cpus: int | None
    bandwidth_bytes_per_s: float
    # "published" (a known chip) or "memcpy" (measured on one thread: a lower bound).
    bandwidth_source: str


@attrs.frozen(kw_only=True)
class ModelShape:
    weights_bytes: int
    layers: int
    kv_heads: int
    head_dim: int
    attention_heads: int
    hidden_size: int
    intermediate_size: int
    dtype_bytes: int
    context_window: int

    @property
    def kv_bytes_per_token(self) -> int:
        # Keys and values, for every layer.
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes


@attrs.frozen(kw_only=True)
class MemoryPlan:
    """How the budget is split; `usable_bytes` is what the batch's KV may take."""

    budget_bytes: int
    budget_source: str
    weights_bytes: int
    transient_bytes: int
    prompt_cache_bytes: int
    usable_bytes: int
    kv_bytes_per_token: int
    context_window: int
    max_safe_context: int


def read_model_shape(path: Path, context_window: int) -> ModelShape:
    """The figures of the model directory's config.json and weight files."""
    config: dict[str, Any] = json.loads((path / "config.json").read_text())
    text = config.get("text_config") or config
    heads = int(text.get("num_attention_heads") or text.get("n_head") or 1)
    hidden = int(text.get("hidden_size") or text.get("n_embd") or 0)
    dtype = str(text.get("torch_dtype") or config.get("torch_dtype") or "")
    return ModelShape(
        weights_bytes=sum(file.stat().st_size for file in path.glob("*.safetensors")),
        layers=int(text.get("num_hidden_layers") or text.get("n_layer") or 0),
        kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        attention_heads=heads,
        hidden_size=hidden,
        intermediate_size=int(text.get("intermediate_size") or 4 * hidden),
        dtype_bytes=_DTYPE_BYTES.get(dtype, _DEFAULT_DTYPE_BYTES),
        context_window=context_window,
    )


def transient_bytes(shape: ModelShape, *, prefill_rows: int, prefill_step: int) -> int:
    """The working set of the largest prefill chunk: every row at once, at full context.

    The unfused attention of a CPU prefill holds `heads x step x context`
    scores per row; the MLP and the residual stream add a few hidden-sized
    rows per token.
    """
    per_token = shape.attention_heads * shape.context_window + 3 * shape.intermediate_size + 4 * shape.hidden_size
    return prefill_rows * prefill_step * per_token * _ACTIVATION_BYTES


def plan(shape: ModelShape, machine: Machine, *, budget: int, prompt_cache: int, transient: int) -> MemoryPlan:
    """Split the budget (or 75% of RAM when `budget` is 0).

    Raises:
        BudgetError: the weights and one prefill chunk leave no room for KV.
    """
    budget_bytes = budget or int(machine.ram_bytes * _RAM_SHARE)
    free = budget_bytes - shape.weights_bytes - transient
    cache_bytes = max(0, min(prompt_cache, int(free * _PROMPT_CACHE_SHARE)))
    usable = free - cache_bytes
    per_token = shape.kv_bytes_per_token
    if per_token <= 0 or usable < per_token:
        raise BudgetError(
            f"a memory budget of {budget_bytes} bytes cannot serve this model: its weights take "
            f"{shape.weights_bytes} and a prefill chunk {transient}, leaving {usable} bytes for a KV cache "
            f"of {per_token} bytes per token (raise MLX_RELAY_MEMORY_BUDGET or lower MLX_RELAY_MAX_BATCH "
            "and MLX_RELAY_PREFILL_STEP_SIZE)"
        )
    return MemoryPlan(
        budget_bytes=budget_bytes,
        budget_source="MLX_RELAY_MEMORY_BUDGET" if budget else f"{_RAM_SHARE:.0%} of RAM",
        weights_bytes=shape.weights_bytes,
        transient_bytes=transient,
        prompt_cache_bytes=cache_bytes,
        usable_bytes=usable,
        kv_bytes_per_token=per_token,
        context_window=shape.context_window,
        max_safe_context=min(shape.context_window, usable // per_token),
    )


def predicted_decode_rate(shape: ModelShape, machine: Machine, context: int) -> float:
    """Tokens/s of one stream when every step reads the weights and the KV once: an upper bound."""
    return machine.bandwidth_bytes_per_s / (shape.weights_bytes + context * shape.kv_bytes_per_token)


def read_machine() -> Machine:
    """RAM (the cgroup limit where lower), the chip's name, and its memory bandwidth."""
    chip = _chip()
    known = _APPLE_BANDWIDTH.get(chip.removeprefix("Apple ").strip()) if chip else None
    return Machine(
        ram_bytes=_ram_bytes(),
        chip=chip,
        cpus=os.cpu_count(),
        bandwidth_bytes_per_s=known or _measure_bandwidth(),
        bandwidth_source="published" if known else "memcpy",
    )


def _ram_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # A container's memory limit is the real ceiling; "max" means none.
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            raw = limit.read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            total = min(total, int(raw))
    return int(total)


def _chip() -> str | None:
    if platform.system() == "Darwin":
        try:
            found = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return found.stdout.strip() or None
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or None


def _measure_bandwidth() -> float:
    source, target = bytearray(_PROBE_BYTES), bytearray(_PROBE_BYTES)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        target[:] = source
        best = min(best, time.perf_counter() - start)
    # A copy reads and writes every byte.
    return 2 * _PROBE_BYTES / best


@attrs.define
class KvLedger:
    """The batch's reserved KV, laid out as mlx-lm's BatchKVCache lays it out.

    A batch cache is padded to its longest row, so n rows reserve
    `n x longest x bytes_per_token`, not the sum of their lengths. A row's
    extent is its prompt plus its max_tokens. Model thread only; the
    published totals are plain ints, safe to read from the event loop.
    """

    bytes_per_token: int
    budget_bytes: int
    _extents: dict[int, int] = attrs.field(factory=dict, init=False)
    reserved_bytes: int = attrs.field(default=0, init=False)

    def fits(self, extent: int) -> bool:
        longest = max([extent, *self._extents.values()])
        return (len(self._extents) + 1) * longest * self.bytes_per_token <= self.budget_bytes

    def reserve(self, uid: int, extent: int) -> None:
        self._extents[uid] = extent
        self._publish()

    def release(self, uid: int) -> None:
        if self._extents.pop(uid, None) is not None:
            self._publish()

    def _publish(self) -> None:
        longest = max(self._extents.values(), default=0)
        self.reserved_bytes = len(self._extents) * longest * self.bytes_per_token


@attrs.frozen(kw_only=True)
class DecodeRate:
    """Predicted tokens/s of one stream, from memory bandwidth alone (an upper bound)."""

    empty_context: float
    max_safe_context: float


@attrs.frozen(kw_only=True)
class Fit:
    """What /fit reports: the machine, the model's footprint, the plan, and the decode bound."""

    machine: Machine
    model: ModelShape
    memory: MemoryPlan
    decode_tokens_per_s: DecodeRate


def assess(path: Path, *, context_window: int, budget: int, prompt_cache: int, max_batch: int, prefill_step: int) -> Fit:
    """Read the machine and the model and plan the budget; blocking (run it off the event loop).

    Raises:
        BudgetError: the budget cannot hold the model.
    """
    machine, shape = read_machine(), read_model_shape(path, context_window)
    transient = transient_bytes(shape, prefill_rows=max_batch, prefill_step=prefill_step)
    memory = plan(shape, machine, budget=budget, prompt_cache=prompt_cache, transient=transient)
    rate = DecodeRate(
        empty_context=predicted_decode_rate(shape, machine, 0),
        max_safe_context=predicted_decode_rate(shape, machine, memory.max_safe_context),
    )
    return Fit(machine=machine, model=shape, memory=memory, decode_tokens_per_s=rate)
