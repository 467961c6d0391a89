"""The form a quantized model's weights are served in (`MLX_RELAY_WEIGHTS`), chosen with the window in view.

Each form has its own memory plan: float32 weights hold four to eight
times the 4-bit bytes and compute (so cache) float32 keys and values,
twice the KV per token; 16-bit weights hold half the float32 bytes and
keep 16-bit KV, as the stored weights do. Under `auto` on the CPU backend
the weights are dequantized to float32 only when its plan still admits the
whole window (the model's, or `MLX_RELAY_CONTEXT_LIMIT`'s) with the
configured batch and prefill; otherwise the form that decodes fastest of
those whose plan admits it, and where none does, the form with the longest
window.

"Decodes fastest" is a fixed table, not a timing at start: a fair timing
of MLX's 4-bit CPU kernels takes seconds, and the same settings must reach
the same form wherever they are planned (the front plans once; its model
worker serves the form it was sent, workers/model.py). The figures
are whole-model speeds measured once by `bench/weight_forms.py`
(docs/memory.md, "The weights' form"): the 4-bit weights as stored decoded
faster than bfloat16 ones and hold a quarter of their bytes, though
bfloat16 prefilled twice as fast (name it for long prompts); `/fit` shows
both ratios as estimates. On Metal and CUDA `auto` keeps the weights as
stored: their quantized kernels are fast, and nothing was measured there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

import attrs

from pipeline.settings import Settings
from stages.kv.machine import backend
from stages.kv.plan import BudgetError, Fit
from stages.kv.shape import ModelShape
from stages.models.loading import ModelInfo
from stages.models.weights import (
    SIXTEEN_BIT,
    WeightForm,
    WeightOption,
    dequantized,
    float32_bytes,
    quantization,
    stored,
)
from stages.shard.cluster import Cluster

# Tokens/s relative to the 4-bit weights as stored, on MLX's CPU backend with MKL, Qwen3-0.6B's layers
# (bench/weight_forms.py; docs/memory.md, "The weights' form"). The 16-bit and 4-bit kernels are MLX's own,
# so their ratio holds with any BLAS; float32's is the BLAS's (nearer 1.3x decode with the reference BLAS).
CPU_DECODE_SPEED: Mapping[str, float] = {"float32": 4.2, "bfloat16": 0.73, "float16": 0.29, "stored": 1.0}
CPU_PREFILL_SPEED: Mapping[str, float] = {"float32": 27.6, "bfloat16": 2.1, "float16": 1.4, "stored": 1.0}
# The forms `auto` may serve: float16 holds what bfloat16 does and decoded slower, and
# overflows on models trained in bfloat16.
_AUTO_FORMS = ("float32", "bfloat16", "stored")
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class WeightsError(ValueError):
    """`MLX_RELAY_WEIGHTS` names a form this set-up cannot serve (raised at start)."""


def plan_weights(
    settings: Settings, info: ModelInfo, fit: Callable[..., Fit], *, cluster: Cluster | None
) -> tuple[Fit, WeightForm]:
    """The memory plan, and the form the weights are served in.

    Raises:
        BudgetError: the form named cannot be held by the budget (nor the weights as stored).
        WeightsError: a 16-bit form with a sharded model (its ranks agree on float32 or stored only).
    """
    quantized = quantization(info.path)
    if quantized is None:
        return fit(), stored("not quantized")
    setting = "stored" if settings.keep_quantized else settings.weights
    if cluster is not None and setting in SIXTEEN_BIT:
        raise WeightsError(f"MLX_RELAY_WEIGHTS={setting} cannot be served with --shard: choose float32 or stored")
    device = backend()
    forms = ("float32", "stored") if cluster is not None else ("float32", *SIXTEEN_BIT, "stored")
    # Every form's size is the float32 weights' scaled: their headers are read once.
    float32_size = float32_bytes(info.path, quantized)
    plans = {form: _plan(fit, form, float32_size) for form in forms}
    options = tuple(_option(form, plans[form], info.context_window, device) for form in forms)
    if setting == "auto":
        setting, why = _auto(plans, info.context_window, device)
        stored_why = why
    elif settings.keep_quantized:
        why, stored_why = "as MLX_RELAY_KEEP_QUANTIZED is set", "MLX_RELAY_KEEP_QUANTIZED is set"
    else:
        why, stored_why = "as MLX_RELAY_WEIGHTS names", "MLX_RELAY_WEIGHTS=stored"
    planned = plans[setting] or _plan(fit, setting, float32_size, strict=True)
    assert planned is not None
    if setting == "stored":
        return planned, stored(stored_why, options)
    held = planned.model.weights_bytes
    form = dequantized(
        int(quantized["bits"]), held, sliced=cluster is not None, dtype=setting, why=why, options=options
    )
    return planned, form


def _plan(fit: Callable[..., Fit], form: str, float32_size: int, *, strict: bool = False) -> Fit | None:
    """`form`'s plan; None where the budget cannot hold it, unless `strict` (then its BudgetError)."""
    try:
        if form == "stored":
            return fit()
        size = float32_size * _BYTES[form] // 4
        return fit(form=partial(served_as, weights_bytes=size, dtype_bytes=_BYTES[form]))
    except BudgetError:
        if strict:
            raise
        return None


def served_as(shape: ModelShape, *, weights_bytes: int, dtype_bytes: int) -> ModelShape:
    """The model dequantized: its weights' bytes, and its keys and values computed (so cached) in that type."""
    return attrs.evolve(shape, weights_bytes=weights_bytes, dtype_bytes=dtype_bytes)


def _option(form: str, planned: Fit | None, window: int, device: str) -> WeightOption:
    safe = planned.memory.max_safe_context if planned is not None else 0
    return WeightOption(
        form=form,
        weights_bytes=planned.model.weights_bytes if planned is not None else 0,
        kv_bytes_per_token=planned.memory.kv_bytes_per_token if planned is not None else 0,
        max_safe_context=safe,
        admits_window=safe >= window,
        relative_decode_speed=CPU_DECODE_SPEED[form] if device == "cpu" else None,
        relative_prefill_speed=CPU_PREFILL_SPEED[form] if device == "cpu" else None,
    )


def _auto(plans: Mapping[str, Fit | None], window: int, device: str) -> tuple[str, str]:
    """`auto`'s form and why: float32 where its plan admits the window, else the fastest form that does."""
    if device != "cpu":
        return "stored", f"quantized kernels run fast on {device}"
    held = {form: plans[form] for form in _AUTO_FORMS if form in plans}
    safe = {form: planned.memory.max_safe_context for form, planned in held.items() if planned is not None}
    if not safe:
        return "stored", "no form fits the memory budget"
    # float32 first, as the table ranks it: with a fast BLAS it decoded 4x and prefilled 28x the stored form.
    ranked = ["float32", *sorted(set(safe) - {"float32"}, key=lambda form: -CPU_DECODE_SPEED[form])]
    whole = [form for form in ranked if safe.get(form, 0) >= window]
    chosen = whole[0] if whole else max(ranked, key=lambda form: safe.get(form, 0))
    if chosen == "float32":
        return chosen, f"for the CPU backend: its plan admits the {window}-token window"
    lost = "do not fit the memory budget" if "float32" not in safe else f"would cut the window to {safe['float32']}"
    return chosen, f"for the CPU backend: float32 weights {lost}"
