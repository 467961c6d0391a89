"""Exponentials on MLX's CPU backend four times faster: the activations and the attention softmax a model runs.

The Linux `mlx[cpu]` wheel evaluates `mx.exp`, `mx.sigmoid` and `mx.tanh` one element at a time through its
portable `simd::exp`, whose polynomial's six `fma`s are library calls on a build without FMA: about 12 ns an
element here, 16 for `nn.silu` and 27 for `nn.gelu_approx`. A 512-token prefill chunk of SmolLM2 holds 23.6 M
gate activations (0.39 s of its 1.6 s), a decode step's attention one exponential for every score.

`exp_parts` is the same computation (the same range reduction and the same polynomial, with MLX's
coefficients) written as plain arithmetic that MLX's compiler fuses and the C++ compiler vectorises: 3 ns an
element, within 1.2e-7 of `mx.exp` (90% of values the same bits; the rest differ in the last place, where an
`fma` rounds once and a multiply-add twice). Only arguments at or below zero are needed: a softmax's shifted
scores, and a sigmoid's `exp(-|x|)`.

2**n is built from its bits (`view`), which MLX cannot trace shapelessly; the arithmetic either side of it is
compiled shapeless, so one trace serves every shape, and these functions must not run inside another
function's shapeless compile. That is why `install` rebinds only names called eagerly: mlx-lm's `swiglu`
where a model module imported it, and a gated MLP's `__call__` where it is exactly the expression replaced.
Off on Metal and CUDA, under `MLX_RELAY_CPU_ATTENTION=mlx`, and for any dtype but float32 (the originals run).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import mlx.core as mx
from mlx.nn.layers import activations as mlx_activations
from mlx_lm.models import activations as mlx_lm_activations

_LOG2_E = 1.4426950408889634
# Adding and subtracting 1.5 * 2**23 rounds a float32 of magnitude under 2**22 to the nearest integer.
_ROUND = 12582912.0
# Below -88 MLX's exp gives 0; 2**-127 built from its bits is 0 too.
_FLOOR = -88.0
# sqrt(2 / pi), doubled: gelu_approx's 0.5 * (1 + tanh(y)) is sigmoid(2y).
_GELU_SCALE = 1.5957691216057308

# The CPU's kernels' switch (docs/configuration.md): `mlx` keeps MLX's own attention (cpu_attention.py), activations
# and matmuls (cpu_matmul.py).
CHOICE_VARIABLE = "MLX_RELAY_CPU_ATTENTION"

# Below this many elements MLX's one fused kernel costs less than our three and a `view` (about 40 us a call
# against MLX's 9 us at 128 elements and 31 at 1,536, its 67 at 4,096 against our 47; bench.cpu_exp): a decode step's
# gate at one row of SmolLM2 stays MLX's.
_MIN_ELEMENTS = 4096

mlx_gelu_approx: Callable[[mx.array], mx.array] = mlx_activations.gelu_approx
mlx_swiglu: Callable[[mx.array, mx.array], mx.array] = mlx_lm_activations.swiglu


@partial(mx.compile, shapeless=True)
def _reduced(x: mx.array) -> tuple[mx.array, mx.array]:
    """exp(-|x|) as 2**f's polynomial (f in [-0.5, 0.5]) and the bits of 2**n, where -|x| log2(e) = n + f."""
    t = mx.maximum(-mx.abs(x), _FLOOR) * _LOG2_E
    n = (t + _ROUND) - _ROUND
    f = t - n
    p = f * 1.535336188319500e-4 + 1.339887440266574e-3
    p = p * f + 9.618437357674640e-3
    p = p * f + 5.550332471162809e-2
    p = p * f + 2.402264791363012e-1
    p = p * f + 6.931472028550421e-1
    p = p * f + 1.0
    return p, (n.astype(mx.int32) + 127) << 23


def exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """exp(-|x|) for float32 x as two factors, which the caller's compiled arithmetic multiplies: `mx.exp(x)`
    for x <= 0, such as a softmax's scores less their maximum."""
    polynomial, bits = _reduced(x)
    return polynomial, bits.view(mx.float32)


@partial(mx.compile, shapeless=True)
def _product(polynomial: mx.array, power: mx.array) -> mx.array:
    return polynomial * power


def exp_nonpositive(x: mx.array) -> mx.array:
    """`mx.exp(x)` for float32 x <= 0 (NaN stays NaN)."""
    return _product(*exp_parts(x))


@partial(mx.compile, shapeless=True)
def _gated(x: mx.array, y: mx.array, polynomial: mx.array, power: mx.array, up: mx.array) -> mx.array:
    """x * sigmoid(y) * up, given exp(-|y|) as two factors."""
    z = polynomial * power
    # sigmoid(y) is 1 / (1 + z) for y >= 0 and z / (1 + z) below; a float step, as `where` is not vectorised.
    step = (y >= 0).astype(mx.float32)
    return x * (step + z * (1.0 - step)) / (1.0 + z) * up


@partial(mx.compile, shapeless=True)
def _gelu_argument(x: mx.array) -> mx.array:
    return _GELU_SCALE * (x + 0.044715 * x * x * x)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's `swiglu`: silu(gate) * x."""
    if gate.dtype != mx.float32 or x.dtype != mx.float32 or gate.size < _MIN_ELEMENTS:
        return mlx_swiglu(gate, x)
    return _gated(gate, gate, *exp_parts(gate), x)


def geglu(gate: mx.array, x: mx.array) -> mx.array:
    """gelu_approx(gate) * x: 0.5 gate (1 + tanh(sqrt(2/pi) (gate + 0.044715 gate^3))), as gate * sigmoid(2 sqrt(2/pi)
    (...)), times x."""
    if gate.dtype != mx.float32 or x.dtype != mx.float32 or gate.size < _MIN_ELEMENTS:
        return mlx_gelu_approx(gate) * x
    y = _gelu_argument(gate)
    return _gated(gate, y, *exp_parts(y), x)


def _gelu_mlp_call(self: Any, x: mx.array) -> mx.array:
    out: mx.array = self.down_proj(geglu(self.gate_proj(x), self.up_proj(x)))
    return out


def _silu_mlp_call(self: Any, x: mx.array) -> mx.array:
    out: mx.array = self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
    return out


# A gated MLP's whole `__call__` body, as mlx-lm writes it, and the same expression over these functions.
_MLP_BODIES: dict[str, Callable[[Any, mx.array], mx.array]] = {
    "return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))": _gelu_mlp_call,
    "return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))": _silu_mlp_call,
}

# What `install` rebound: (owner, attribute, mlx-lm's, ours), for `use` to switch back and forth.
_rebound: list[tuple[Any, str, Any, Any]] = []


def ours_wanted() -> bool:
    """Whether this process computes on the CPU backend and `CHOICE_VARIABLE` leaves the CPU's kernels to us."""
    return mx.default_device() == mx.cpu and os.environ.get(CHOICE_VARIABLE, "numpy") != "mlx"


def install() -> bool:
    """Rebinds, in every mlx-lm model module imported so far, the activations called eagerly; True on the CPU.

    Call after the model is built, so that its modules are imported; a later model's modules are rebound by a
    later call. `mlx_lm.models.activations` itself keeps mlx-lm's `swiglu`, for a module that calls it inside a
    shapeless compile of its own.
    """
    if not ours_wanted():
        return False
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models.") or module is None or module is mlx_lm_activations:
            continue
        if getattr(module, "swiglu", None) is mlx_swiglu:
            _rebound.append((module, "swiglu", mlx_swiglu, swiglu))
        mlp = getattr(module, "MLP", None)
        if isinstance(mlp, type) and (replacement := _MLP_BODIES.get(_body(mlp))) is not None:
            _rebound.append((mlp, "__call__", mlp.__dict__["__call__"], replacement))
    use(ours=True)
    return True


def use(*, ours: bool) -> None:
    """Ours where `install` put them, or mlx-lm's again (bench.cpu_exp compares the two in one process)."""
    for owner, attribute, theirs, replacement in _rebound:
        setattr(owner, attribute, replacement if ours else theirs)


def _body(mlp: type) -> str:
    """The one statement of `mlp.__call__`, or "" where it is more than one (or not Python source)."""
    call = mlp.__dict__.get("__call__")
    if call is None or any(owner is mlp for owner, *_ in _rebound):
        return ""
    try:
        lines = [line.strip() for line in inspect.getsource(call).splitlines()[1:] if line.strip()]
    except (OSError, TypeError):
        return ""
    return lines[0] if len(lines) == 1 else ""


@partial(mx.compile, shapeless=True)
def _shifted(scores: mx.array) -> mx.array:
    return scores - mx.max(scores, axis=-1, keepdims=True)


@partial(mx.compile, shapeless=True)
def _masked(scores: mx.array, allowed: mx.array) -> mx.array:
    # The finite floor, as mlx-lm's masked softmax: a row whose keys are all hidden (left padding) gets uniform
    # weights rather than NaNs.
    scores = mx.where(allowed, scores, mx.finfo(mx.float32).min)
    return scores - mx.max(scores, axis=-1, keepdims=True)


def lazy_attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any) -> mx.array:
    """`mx.fast.scaled_dot_product_attention` for float32, its softmax's exponentials through `exp_parts`.

    Stays lazy, for a decode step; `mask` is None, "causal" or an array that broadcasts to the scores.
    """
    batch, heads, rows, dim = queries.shape
    kv_heads, context = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    # A KV head's group of query heads shares one matmul: (batch, kv heads, group * rows, context).
    grouped = (queries * scale).reshape(batch, kv_heads, group * rows, dim)
    scores = (grouped @ keys.swapaxes(-1, -2)).reshape(batch, kv_heads, group, rows, context)
    if isinstance(mask, str):
        mask = mx.arange(context)[None] <= (context - rows + mx.arange(rows))[:, None]
    if isinstance(mask, mx.array):
        mask = _grouped_mask(mask, kv_heads, group)
        shifted = _masked(scores, mask) if mask.dtype == mx.bool_ else _shifted(scores + mask)
    else:
        shifted = _shifted(scores)
    weights = exp_nonpositive(shifted)
    totals = weights.sum(axis=-1, keepdims=True)
    attended = (weights.reshape(batch, kv_heads, group * rows, context) @ values).reshape(
        batch, kv_heads, group, rows, dim
    )
    return (attended / totals).reshape(batch, heads, rows, dim)


def _grouped_mask(mask: mx.array, kv_heads: int, group: int) -> mx.array:
    """A mask that broadcasts to (batch, heads, rows, context), as one that broadcasts to the grouped scores."""
    full = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if full.shape[1] == 1:
        return full[:, :, None]
    return full.reshape(full.shape[0], kv_heads, group, *full.shape[2:])
