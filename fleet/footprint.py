"""A model's footprint: the memory its own plan is given (stages/kv/plan.py), known before it loads.

The fleet's budget (MLX_RELAY_MEMORY_BUDGET, else 75% of RAM) is shared
by every resident model; each model's share is its footprint, and its
engine plans within exactly that share. A models file may set the share
(`kv.memory_budget`); otherwise it is the smallest budget whose plan
leaves KV for one row of `kv.context` tokens (default: the model's
context window, or its context limit), the plan's prefill working set and
prompt cache included.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from fleet.spec import ModelSpec
from pipeline.settings import Settings
from stages.kv.machine import Machine
from stages.kv.plan import budget_for
from stages.kv.shape import KvScheme, ModelShape, read_model_shape
from stages.models.vlm import vision_config

# The share of RAM the fleet plans for when no budget is set, as one model's plan does.
RAM_SHARE = 0.75


@attrs.frozen(kw_only=True)
class Footprint:
    bytes: int
    # "kv.memory_budget" (set in the models file) or "planned" (for `kv_tokens` tokens of KV).
    source: str
    kv_tokens: int
    weights_bytes: int


def fleet_budget(settings: Settings, machine: Machine) -> int:
    return settings.memory_budget or int(machine.ram_bytes * RAM_SHARE)


def footprint(spec: ModelSpec, shape: ModelShape, machine: Machine, settings: Settings) -> Footprint:
    """What `spec` takes beside the other models, from its shape (pure: tests pass published configs)."""
    window = min(shape.context_window, spec.defaults.context_limit or shape.context_window)
    bits = settings.kv_bits if spec.kv.kv_bits is None else spec.kv.kv_bits
    if bits is not None:
        # Its KV at the scheme it will run with: a quantized model plans for fewer bytes a token.
        shape = attrs.evolve(
            shape, kv_scheme=KvScheme(bits=bits, group_size=spec.kv.kv_group_size or settings.kv_group_size)
        )
    tokens = min(spec.kv.context or window, window)
    if spec.kv.memory_budget:
        return Footprint(
            bytes=spec.kv.memory_budget, source="kv.memory_budget", kv_tokens=tokens, weights_bytes=shape.weights_bytes
        )
    planned = budget_for(
        attrs.evolve(shape, context_window=window),
        machine,
        shape.kv_bytes(tokens),
        prompt_cache=_or(spec.kv.prompt_cache_bytes, settings.prompt_cache_bytes),
        max_batch=_or(spec.kv.max_batch, settings.max_batch),
        prefill_step=settings.prefill_step_size,
    )
    return Footprint(bytes=planned, source="planned", kv_tokens=tokens, weights_bytes=shape.weights_bytes)


def read_footprint(spec: ModelSpec, path: Path, context_window: int, machine: Machine, settings: Settings) -> Footprint:
    """`footprint` of a model directory; blocking (reads its config and weight sizes)."""
    shape = read_model_shape(path, context_window)
    if vision_config(path) is not None:
        # A vision-language model's gateway holds its encoder cache beside the weights (stages/engine/model_side.py).
        shape = attrs.evolve(shape, weights_bytes=shape.weights_bytes + settings.encoder_cache_bytes)
    return footprint(spec, shape, machine, settings)


def _or(value: int | None, fallback: int) -> int:
    return fallback if value is None else value


def speech_footprint(path: Path) -> Footprint:
    """A speech model's share: its weights twice (the model and a window's activations are about their size
    for Whisper's small models); it holds no KV between requests."""
    weights = sum(file.stat().st_size for file in path.glob("*.safetensors")) + sum(
        file.stat().st_size for file in path.glob("*.npz")
    )
    return Footprint(bytes=2 * weights, source="speech", kv_tokens=0, weights_bytes=weights)
