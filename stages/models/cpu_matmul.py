"""A model's float32 matmuls on a CPU in whichever orientation the BLAS runs faster, measured once at load.

MLX computes a linear layer as `x @ W.T`: one BLAS sgemm whose M is the rows of `x` (the batch's tokens), with the
weight as the transposed right-hand side. At a few rows MKL can pick a slow kernel for that shape: on this
project's 2-core AMD machine, SmolLM2's 576 → 49,152 output projection took 17–19 ms at 3 to 8 rows against 6–7
ms at 2, and its MLP's 576 → 1,536 20–30% more at 3 and 4 rows than the same product written `(W @ x.T).T`,
which hands MKL the weight as the left-hand side and the rows as the small dimension. Which orientation wins
depends on the BLAS, its version and the CPU, so it is measured here, not assumed: for each weight shape of the
model and each row count in `_MEASURED_ROWS`, both are timed over the model's own weights of that shape (as a
decode step reads them: one after another, mostly out of cache), and the flipped one is kept only where it is
clearly faster. The two compute the same product, in a different order of float32 additions. What was measured is
kept under the cache root for the machine (the BLAS, its threads, the CPU and MLX), so a later load of the same
shapes measures nothing.

Only float32 linear layers on the CPU backend, in a model with enough weights for a step's matmuls to outweigh a
Python call (`_LEAST_WEIGHT_BYTES`); `MLX_RELAY_CPU_ATTENTION=mlx` leaves MLX's own, as it does for attention and
the activations (stages/models/cpu_exp.py). Model thread only.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from pathlib import Path

import mlx.core as mx
import structlog
from mlx.nn.layers.base import Module
from mlx.nn.layers.embedding import Embedding
from mlx.nn.layers.linear import Linear

from stages.models.blas import environment_threads, preload_blas
from stages.models.cpu_exp import ours_wanted
from stages.models.publish import default_cache_root

log = structlog.get_logger(stage="models")

# Row counts measured. One row is a matrix-vector product, whose kernel held in every measurement. MKL's slow kernel
# for two threads was at 3 to 8 rows; at 12 neither way led, and at 16 and 32 (a 16-row decode step, 4 rows' verifying
# pass of 4 or 8 positions) the flipped products took 1.03-1.09x (SmolLM2) and 1.13-1.29x (Gemma 3) less in a forward
# pass. A row count not measured keeps MLX's.
_MEASURED_ROWS = (2, 3, 4, 5, 6, 7, 8, 16, 32)
# The flipped product is kept where it takes at most this share of MLX's time: a shared machine's noise is ±5%.
_KEPT_BELOW = 0.85
# Layers of one shape timed together: enough to read them mostly from memory, as a step does.
_LAYERS_TIMED = 64
# Below this, a model is a demo whose step is mostly Python: the measuring would cost more than it saves.
_LEAST_WEIGHT_BYTES = 32 << 20
_ROUNDS = 3
# A call this long (a large vocabulary's output projection) reads its weight from memory on its own and outlasts the
# noise: it is not warmed first, and takes a round fewer.
_LONG_CALL = 0.02
# What this machine measured, by weight shape: read from the cache root once, then a model loaded again (or another
# of the same shapes, in this process or a later one) reuses it.
_measured: dict[tuple[int, int], frozenset[int]] = {}


def flipped_product(x: mx.array, weight: mx.array) -> mx.array:
    """`x @ weight.T`, computed as `(weight @ x.T).T` over x's rows."""
    rows = x.size // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    return (weight @ flat.T).T.reshape(*x.shape[:-1], weight.shape[0])


class OrientedLinear(Linear):
    """A linear layer that takes the flipped product at the row counts in `flipped_rows`."""

    flipped_rows: frozenset[int] = frozenset()

    def __call__(self, x: mx.array) -> mx.array:
        if x.size // x.shape[-1] not in self.flipped_rows:
            return super().__call__(x)
        product = flipped_product(x, self["weight"])
        return product + self["bias"] if "bias" in self else product


class OrientedEmbedding(Embedding):
    """A tied embedding whose output projection (`as_linear`) takes the flipped product at `flipped_rows`."""

    flipped_rows: frozenset[int] = frozenset()

    def as_linear(self, x: mx.array) -> mx.array:
        if x.size // x.shape[-1] not in self.flipped_rows:
            product: mx.array = super().as_linear(x)  # type: ignore[no-untyped-call]  # mlx's, untyped
            return product
        return flipped_product(x, self.weight)


def install(model: Module) -> dict[tuple[int, int], tuple[int, ...]]:
    """Measures and sets each float32 linear layer's orientation; returns, per (outputs, inputs) shape, the row
    counts flipped. Nothing on another backend, under `MLX_RELAY_CPU_ATTENTION=mlx`, or in a small model."""
    if not ours_wanted():
        return {}
    groups = _by_shape(model)
    if sum(weight_bytes(layers) for layers in groups.values()) < _LEAST_WEIGHT_BYTES:
        return {}
    if not _measured:
        _measured.update(_read_kept())
    started, unmeasured = time.perf_counter(), [shape for shape in groups if shape not in _measured]
    chosen = {}
    for shape, layers in groups.items():
        if (rows := _measured.get(shape)) is None:
            rows = _measured[shape] = flipped_rows([_weight(layer) for layer in layers[:_LAYERS_TIMED]])
        for layer in layers:
            layer.__class__ = OrientedEmbedding if isinstance(layer, Embedding) else OrientedLinear
            layer.flipped_rows = rows
        chosen[shape] = tuple(sorted(rows))
    if unmeasured:
        _keep()
    flipped = {f"{outputs}x{inputs}": rows for (outputs, inputs), rows in chosen.items()}
    seconds = round(time.perf_counter() - started, 2)
    log.info("cpu_matmul.chosen", measured=len(unmeasured), seconds=seconds, flipped=flipped, kept_in=str(kept_path()))
    return chosen


def kept_path() -> Path:
    """Where the measurements are kept, for every process on this machine (delete it to measure again)."""
    return default_cache_root() / "cpu_matmul.json"


def machine() -> str:
    """What the measurements hold for: the BLAS, its threads, the CPU and MLX, and the row counts measured (a
    measured count added later is measured again, not taken as MLX's)."""
    threads = environment_threads() or _cores()
    rows = ",".join(str(count) for count in _MEASURED_ROWS)
    return f"{preload_blas()}; {threads} threads; {_cpu_model()}; mlx {metadata.version('mlx')}; rows {rows}"


def _cores() -> int:
    # macOS has no affinity call (its CPU backend, asked for, still measures).
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read_kept() -> dict[tuple[int, int], frozenset[int]]:
    try:
        entry = json.loads(kept_path().read_text()).get(machine(), {})
        return {_shape(name): frozenset(rows) for name, rows in entry.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _keep() -> None:
    """This machine's measurements written in place of its entry, atomically; other machines' entries kept."""
    path = kept_path()
    try:
        kept = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        kept = {}
    kept[machine()] = {f"{outputs}x{inputs}": sorted(rows) for (outputs, inputs), rows in sorted(_measured.items())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as file:
            json.dump(kept, file, indent=1)
        os.replace(file.name, path)
    except OSError as error:
        log.warning("cpu_matmul.not_kept", path=str(path), error=str(error))


def _shape(name: str) -> tuple[int, int]:
    outputs, _, inputs = name.partition("x")
    return int(outputs), int(inputs)


def flipped_rows(weights: Sequence[mx.array]) -> frozenset[int]:
    """The row counts at which `flipped_product` over `weights` takes under `_KEPT_BELOW` of `x @ w.T`'s time, each
    timed at its fastest of `_ROUNDS` rounds that take the two in turn: another process's burst only adds time, so a
    round it lands in is not the fastest, and the choice held from load to load where a vote of rounds did not."""
    inputs = weights[0].shape[1]
    kept = set()
    for rows in _MEASURED_ROWS:
        x = mx.random.normal((rows, inputs))
        mx.eval(x)

        def theirs() -> list[mx.array]:
            return [x @ w.T for w in weights]  # noqa: B023  # called within this iteration

        def ours() -> list[mx.array]:
            return [flipped_product(x, w) for w in weights]  # noqa: B023  # called within this iteration

        # The first calls page in what the timed ones reuse, but a long call pages in what it reads itself.
        first = _seconds(theirs)
        long = first >= _LONG_CALL
        if not long:
            mx.eval(ours())
        their_times, our_times = [first] if long else [], []
        for _ in range(_ROUNDS - 1 if long else _ROUNDS):
            our_times.append(_seconds(ours))
            their_times.append(_seconds(theirs))
        if min(our_times) < _KEPT_BELOW * min(their_times):
            kept.add(rows)
    return frozenset(kept)


def weight_bytes(layers: Iterable[Module]) -> int:
    return sum(_weight(layer).nbytes for layer in layers)


def _by_shape(model: Module) -> dict[tuple[int, int], list[Module]]:
    """The model's float32 linear layers by weight shape; its embedding too where it is the output projection
    (a model with no `lm_head` of its own ties them)."""
    modules = model.named_modules()  # type: ignore[no-untyped-call]  # mlx's, untyped
    tied = not any(name.split(".")[-1] == "lm_head" for name, _ in modules)
    groups: dict[tuple[int, int], list[Module]] = defaultdict(list)
    for _, module in modules:
        if type(module) in (Linear, OrientedLinear) or (tied and type(module) in (Embedding, OrientedEmbedding)):
            weight = _weight(module)
            if weight.dtype == mx.float32 and weight.ndim == 2:
                groups[(weight.shape[0], weight.shape[1])].append(module)
    return groups


def _weight(layer: Module) -> mx.array:
    weight: mx.array = layer["weight"]
    return weight


def _seconds(run: Callable[[], list[mx.array]]) -> float:
    began = time.perf_counter()
    mx.eval(run())
    return time.perf_counter() - began
