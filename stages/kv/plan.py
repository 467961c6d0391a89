"""The memory plan: how the budget splits, computed once before any work is admitted.

Pure arithmetic over the model's shape and the machine: the weights, the
working set of one prefill chunk as the backend in use computes it, the
prompt cache's share, and what is left for the batch's KV, hence the
longest context one row can be served at. Every figure is an estimate
from the config; /fit shows the inputs so a reader can check it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from stages.kv.machine import Machine, read_machine
from stages.kv.shape import FULL, KvScheme, ModelShape, read_model_shape

# The share of RAM a server may plan for when no budget is set: the OS,
# the HTTP side and MLX's buffer cache need the rest (Metal's recommended
# working set on Apple silicon is about the same share).
_RAM_SHARE = 0.75
# The prompt cache may take at most this share of what the weights and a
# prefill chunk leave, so live requests always keep the larger part.
_PROMPT_CACHE_SHARE = 0.5
# Rows prefilled together may take at most this share of what the weights
# leave; past it fewer rows prefill at once (never fewer than one).
_PREFILL_SHARE = 0.25
# Head dims of MLX's fused prefill attention kernel on Metal; others fall
# back to materialized scores, as every head dim does on the CPU.
_FUSED_HEAD_DIMS = frozenset({64, 80, 128})


class BudgetError(ValueError):
    """The memory budget cannot hold the model and one token of KV."""


@attrs.frozen(kw_only=True)
class Transient:
    """The working set of one prefill chunk, and how it was computed (/fit shows it)."""

    backend: str
    # "fused": mx.fast.scaled_dot_product_attention never holds the score
    # matrix; "unfused": it holds scores and their softmax, heads x chunk x context.
    attention: str
    prefill_rows: int
    prefill_step: int
    # The context the chunk's scores span (the longest safe context); 0 when fused.
    context: int
    # Per token of a chunk: the residual stream, q/k/v and the MLP's hidden rows.
    activation_bytes_per_token: int
    # Per token of a chunk and per token of context attended (unfused only).
    score_bytes_per_context_token: int
    bytes: int
    formula: str


@attrs.frozen(kw_only=True)
class MemoryPlan:
    """How the budget is split; `usable_bytes` is what the batch's KV may take."""

    budget_bytes: int
    budget_source: str
    weights_bytes: int
    transient_bytes: int
    transient: Transient
    prompt_cache_bytes: int
    usable_bytes: int
    kv_bytes_per_token: int
    context_window: int
    max_safe_context: int
    # mlx-lm's prefill_batch_size: the rows whose prompts are prefilled together.
    prefill_rows: int


def transient(shape: ModelShape, *, backend: str, prefill_rows: int, prefill_step: int, context: int) -> Transient:
    """The working set of the rows prefilled together, one chunk of `prefill_step` tokens each."""
    fused = backend != "cpu" and shape.head_dim in _FUSED_HEAD_DIMS
    width = max(shape.hidden_size, shape.attention_heads * shape.head_dim)
    activations = (4 * width + 3 * shape.intermediate_size) * shape.dtype_bytes
    scores = 0 if fused else shape.attention_heads * 2 * shape.dtype_bytes
    spanned = 0 if fused else context
    per_token = activations + scores * spanned
    formula = "rows x step x (4 x max(hidden, heads x head_dim) + 3 x intermediate) x dtype"
    if not fused:
        formula += " + rows x step x heads x context x 2 x dtype (scores and softmax)"
    return Transient(
        backend=backend,
        attention="fused" if fused else "unfused",
        prefill_rows=prefill_rows,
        prefill_step=prefill_step,
        context=spanned,
        activation_bytes_per_token=activations,
        score_bytes_per_context_token=scores,
        bytes=prefill_rows * prefill_step * per_token,
        formula=formula,
    )


def plan(
    shape: ModelShape, machine: Machine, *, budget: int, prompt_cache: int, max_batch: int, prefill_step: int
) -> MemoryPlan:
    """Split the budget (or 75% of RAM when `budget` is 0).

    Raises:
        BudgetError: the weights and one prefill chunk leave no room for one row's KV.
    """
    budget_bytes = budget or int(machine.ram_bytes * _RAM_SHARE)
    free = budget_bytes - shape.weights_bytes
    backend = machine.backend

    def chunk(rows: int, context: int) -> Transient:
        return transient(shape, backend=backend, prefill_rows=rows, prefill_step=prefill_step, context=context)

    step_ceiling = free * _PREFILL_SHARE
    rows = max([1, *(r for r in range(1, max_batch + 1) if chunk(r, shape.context_window).bytes <= step_ceiling)])
    cache_bytes = max(0, min(prompt_cache, int((free - chunk(rows, 0).bytes) * _PROMPT_CACHE_SHARE)))

    def room(context: int) -> int:
        return free - cache_bytes - chunk(rows, context).bytes - shape.kv_bytes(context)

    if room(1) < 0:
        raise BudgetError(
            f"a memory budget of {budget_bytes} bytes cannot serve this model: its weights take "
            f"{shape.weights_bytes} and a prefill chunk {chunk(rows, 1).bytes}, leaving no room for one "
            f"row's KV of {shape.kv_bytes(1)} bytes (raise MLX_RELAY_MEMORY_BUDGET or lower "
            "MLX_RELAY_PREFILL_STEP_SIZE)"
        )
    safe = _largest(1, shape.context_window, lambda context: room(context) >= 0)
    working = chunk(rows, safe)
    return MemoryPlan(
        budget_bytes=budget_bytes,
        budget_source="MLX_RELAY_MEMORY_BUDGET" if budget else f"{_RAM_SHARE:.0%} of RAM",
        weights_bytes=shape.weights_bytes,
        transient_bytes=working.bytes,
        transient=working,
        prompt_cache_bytes=cache_bytes,
        usable_bytes=free - cache_bytes - working.bytes,
        kv_bytes_per_token=shape.kv_bytes_per_token,
        context_window=shape.context_window,
        max_safe_context=safe,
        prefill_rows=rows,
    )


def budget_for(
    shape: ModelShape, machine: Machine, usable: int, *, prompt_cache: int, max_batch: int, prefill_step: int
) -> int:
    """The smallest budget whose plan leaves at least `usable` bytes for the batch's KV (the inverse of `plan`)."""

    def room(budget: int) -> int:
        try:
            plan_ = plan(
                shape, machine, budget=budget, prompt_cache=prompt_cache, max_batch=max_batch, prefill_step=prefill_step
            )
        except BudgetError:
            return -1
        return plan_.usable_bytes

    low, high = shape.weights_bytes, shape.weights_bytes + (1 << 40)
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if room(middle) >= usable else (middle + 1, high)
    return low


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The largest n in [low, high] with fits(n), given fits(low) and a monotone predicate."""
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def predicted_decode_rate(shape: ModelShape, machine: Machine, context: int) -> float:
    """Tokens/s of one stream when every step reads the weights and the KV once: an upper bound."""
    return machine.bandwidth_bytes_per_s / (shape.weights_bytes + context * shape.kv_bytes_per_token)


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
    # The KV cache's scheme in one word ("full", "q8g64"); `model.kv_scheme` has its figures.
    kv_scheme: str = "full"


def assess(
    path: Path,
    *,
    context_window: int,
    budget: int,
    prompt_cache: int,
    max_batch: int,
    prefill_step: int,
    adapter_bytes: int = 0,
    share: Callable[[ModelShape], ModelShape] | None = None,
    form: Callable[[ModelShape], ModelShape] | None = None,
    kv: KvScheme = FULL,
) -> Fit:
    """Read the machine and the model and plan the budget; blocking (run it off the event loop).

    `adapter_bytes` (LoRA adapters held beside the weights) counts as weights;
    `kv` prices every token of KV as that scheme stores it.
    `form` gives the model as it will be served where that differs from its
    files (float32 weights dequantized from the stored ones: stages/models/weights.py).
    `share` gives this process's part of the model when it is sharded over
    several (stages/shard/rank_share.py): the plan is per rank.

    Raises:
        BudgetError: the budget cannot hold the model.
    """
    machine = read_machine()
    shape = read_model_shape(path, context_window)
    if form is not None:
        shape = form(shape)
    shape = attrs.evolve(shape, weights_bytes=shape.weights_bytes + adapter_bytes, kv_scheme=kv)
    if share is not None:
        shape = share(shape)
    memory = plan(
        shape, machine, budget=budget, prompt_cache=prompt_cache, max_batch=max_batch, prefill_step=prefill_step
    )
    rate = DecodeRate(
        empty_context=predicted_decode_rate(shape, machine, 0),
        max_safe_context=predicted_decode_rate(shape, machine, memory.max_safe_context),
    )
    return Fit(machine=machine, model=shape, memory=memory, decode_tokens_per_s=rate, kv_scheme=kv.describe())
