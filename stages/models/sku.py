"""Whether a model fits a machine, from its config.json and weight sizes alone: `/fit`'s arithmetic, before a download.

Takes a Hugging Face config and the weights' bytes (the files' sizes, as the Hub lists them); gives, for this
machine or for each common Apple machine by unified memory, whether the model fits, how many streams fit at its
full window, and at which KV scheme: full precision first, then 8-bit, then 4-bit, the first that holds one row of
the whole window. The plan is `stages/kv/plan.py`'s, so these figures are the ones `/fit` shows once it loads.
"""

from __future__ import annotations

from typing import Any

import attrs

from pipeline.settings import Settings
from stages.kv.machine import Machine
from stages.kv.plan import BudgetError, plan
from stages.kv.shape import FULL, KvScheme, ModelShape, shape_from_config

# Apple silicon's unified memory sizes, GB, from the 8 GB M1 to the 512 GB M3 Ultra.
APPLE_MEMORY_GB = (8, 16, 24, 32, 36, 48, 64, 96, 128, 192, 256, 512)
# Tried in order: the first that holds a row of the whole window is the one to serve with.
SCHEMES = (FULL, KvScheme(bits=8), KvScheme(bits=4))
# Used when a config names no window; as stages/models/loading.py does.
_FALLBACK_CONTEXT_WINDOW = 4096


@attrs.frozen(kw_only=True)
class Planning:
    """The settings the plan splits a budget by (pipeline/settings.py's defaults unless given)."""

    budget: int = 0
    prompt_cache: int = 2**30
    max_batch: int = 16
    prefill_step: int = 512


def planning_of(settings: Settings) -> Planning:
    """The plan's inputs as a server of these settings would split its budget."""
    return Planning(
        budget=settings.memory_budget,
        prompt_cache=settings.prompt_cache_bytes,
        max_batch=settings.max_batch,
        prefill_step=settings.prefill_step_size,
    )


@attrs.frozen(kw_only=True)
class Verdict:
    """One machine's answer. `streams`: rows of the full window the KV budget holds at `kv_scheme`."""

    memory_bytes: int
    fits: bool
    kv_scheme: str | None
    streams: int
    max_context: int
    context_window: int
    weights_bytes: int


def context_window(config: dict[str, Any]) -> int:
    """The window a config names (a multimodal one's `text_config`), else 4096."""
    for source in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length"):
            if isinstance(source.get(key), int):
                return int(source[key])
    return _FALLBACK_CONTEXT_WINDOW


def model_shape(config: dict[str, Any], weights_bytes: int) -> ModelShape:
    return shape_from_config(config, weights_bytes=weights_bytes, context_window=context_window(config))


def verdict(shape: ModelShape, machine: Machine, planning: Planning) -> Verdict:
    """The first scheme of `SCHEMES` that serves a row of the whole window; else the longest context any serves.

    `fits` is False only where no scheme leaves room for one token of KV beside the weights.
    """
    best: tuple[KvScheme, int, int] | None = None
    for scheme in SCHEMES:
        try:
            split = plan(
                attrs.evolve(shape, kv_scheme=scheme),
                machine,
                budget=planning.budget,
                prompt_cache=planning.prompt_cache,
                max_batch=planning.max_batch,
                prefill_step=planning.prefill_step,
            )
        except BudgetError:
            continue
        row = attrs.evolve(shape, kv_scheme=scheme).kv_bytes(shape.context_window)
        streams = split.usable_bytes // row if split.max_safe_context >= shape.context_window else 0
        if best is None or split.max_safe_context > best[2] or streams:
            best = (scheme, streams, split.max_safe_context)
        if streams:
            break
    return Verdict(
        memory_bytes=planning.budget or machine.ram_bytes,
        fits=best is not None,
        kv_scheme=best[0].describe() if best else None,
        streams=best[1] if best else 0,
        max_context=best[2] if best else 0,
        context_window=shape.context_window,
        weights_bytes=shape.weights_bytes,
    )


def apple_machine(memory_gb: int) -> Machine:
    """An Apple silicon machine of `memory_gb` GB unified memory; the plan reads only its memory and backend."""
    return Machine(
        ram_bytes=memory_gb * 10**9,
        chip=None,
        cpus=None,
        bandwidth_bytes_per_s=0.0,
        bandwidth_source="none",
        backend="metal",
    )


def sku_matrix(shape: ModelShape, planning: Planning | None = None) -> list[Verdict]:
    """`verdict` on each Apple machine of `APPLE_MEMORY_GB`, at 75% of its memory (the plan's share, no budget)."""
    planned = attrs.evolve(planning or Planning(), budget=0)
    return [verdict(shape, apple_machine(gb), planned) for gb in APPLE_MEMORY_GB]


def describe(verdict: Verdict) -> str:
    """One line for the CLI: 'fits: 3 streams of 131072 tokens at q8g64' or why not."""
    if not verdict.fits:
        weights, memory = _gb(verdict.weights_bytes), _gb(verdict.memory_bytes)
        return f"does not fit: its weights ({weights}) leave no room for KV in {memory}"
    if verdict.streams:
        return f"fits: {verdict.streams} streams of {verdict.context_window} tokens at {verdict.kv_scheme}"
    return f"fits, with at most {verdict.max_context} of its {verdict.context_window} tokens at {verdict.kv_scheme}"


def _gb(size: int) -> str:
    return f"{size / 10**9:.1f} GB"
