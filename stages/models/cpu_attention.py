"""A prefill chunk's attention on MLX's CPU backend, computed in numpy.

On the CPU backend `mx.fast.scaled_dot_product_attention` falls back to plain ops: the scores, a softmax and a
second matmul. The matmuls go to the BLAS, but the softmax's exponentials run one at a time on one core (the
Linux wheel's kernels are not vectorised): at a 512-token chunk over a 4k-token context they are most of
the chunk's time, and they are why an agent's turn takes longer the longer its conversation grows. numpy's
`exp` is vectorised, and its ufuncs and matmuls let go of the interpreter lock, so blocks of query rows
run on every core the model's BLAS may use. Measured in process (`python -m bench.prefill_chunk
--attention numpy,mlx`), SmolLM2 in float32, 512-token chunks: an agent's turn of 1,024 tokens after
3,072 cached took 23.3 s through MLX and 5.9 s here, a fresh 2,048-token prompt 16.7 s and 7.9 s
(docs/benchmarks.md, "A prefill chunk's attention in numpy").

Each block computes only the keys its rows can see: under the causal mask a chunk's later keys are hidden
from its earlier rows, and the unfused fallback computed (and exponentiated) that hidden half of the
chunk's own square too. A block holds at most `_BLOCK_SCORES` scores, so the memory stays bounded at any
context length (MLX's fallback holds every score of the chunk at once).

Only what is the same computation is taken here: float32 queries, keys and values, no attention sinks,
a mask that is absent, "causal", or an array, and enough query rows and scores that the work dwarfs the
pass's sync (a decode step stays lazy in MLX; a verifying pass over a long context is taken like a chunk).
Everything else goes to MLX's own function, unchanged. A quantized KV cache (`MLX_RELAY_KV_BITS`) takes
mlx-lm's own softmax over every score too: a prefill chunk's or a verifying pass's keys and values are
dequantized for it and attended here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import base

from stages.models.blas import environment_threads
from stages.models.cpu_exp import CHOICE_VARIABLE, lazy_attention

# One query row a sequence is a decode step, which stays lazy in MLX; below this many scores a sequence's pass is
# small, and the per-layer sync costs more than the exponentials it saves (measured break-even about 30k
# scores; at 65k numpy took half MLX's time, at 2.4M a quarter). A verifying pass (the pending token and a
# proposal, 2-9 rows) past that size is taken: SmolLM2's 9-row pass after 3,600 tokens 255 -> 162 ms, 749 ->
# 219 ms over an 8-bit cache (docs/benchmarks.md, "The eighth stop").
_MIN_QUERY_ROWS = 2
_MIN_SCORES = 1 << 16
# Scores a block holds (16 MiB of float32): bounded memory at a 128k window, and small enough that
# every core gets blocks.
_BLOCK_SCORES = 1 << 22
# Below this many scores (query rows times heads times keys, over the batch) a decode step's or short pass's attention
# is MLX's own: its softmax's exponentials cost less than the lazy path's extra kernels, about 20 us a call. Measured
# (`python -m bench.cpu_exp --parts attention`) on SmolLM2's and Gemma 3's heads: one row over 512 keys (4,608 and
# 2,048 scores) 0.95-0.97x, over 1,024 keys 1.12-1.15x, 4 rows over 256 keys 1.06-1.12x, a 9-row verifying pass over
# 128 keys 1.33-1.62x.
_MIN_LAZY_SCORES = 4096

_mlx_attention: Callable[..., mx.array] | None = None
_mlx_quantized_attention: Callable[..., mx.array] | None = None
_pool: ThreadPoolExecutor | None = None


def install() -> bool:
    """Routes prefill attention on the CPU backend through `attention`; True if it is in place.

    Idempotent. Off on Metal and CUDA (their fused kernels skip masked blocks already), and where
    `MLX_RELAY_CPU_ATTENTION=mlx` asks for MLX's own.
    """
    global _mlx_attention, _mlx_quantized_attention, _pool
    chosen = os.environ.get(CHOICE_VARIABLE, "numpy")
    if chosen not in ("numpy", "mlx"):
        raise ValueError(f"{CHOICE_VARIABLE}={chosen!r} is not one of numpy, mlx")
    if _mlx_attention is not None:
        return True
    if mx.default_device() != mx.cpu or chosen == "mlx":
        return False
    _single_threaded_numpy_blas()
    _pool = ThreadPoolExecutor(_threads(), thread_name_prefix="cpu-attention")
    _mlx_attention = mx.fast.scaled_dot_product_attention
    mx.fast.scaled_dot_product_attention = attention  # type: ignore[assignment]
    _mlx_quantized_attention = base.quantized_scaled_dot_product_attention
    base.quantized_scaled_dot_product_attention = quantized_attention
    return True


def mlx_attention() -> Callable[..., mx.array]:
    """MLX's own function, which `install` replaced (bench.prefill_chunk runs both)."""
    return _mlx_attention or mx.fast.scaled_dot_product_attention


def attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    *,
    scale: float,
    mask: mx.array | str | None = None,
    sinks: mx.array | None = None,
    **options: Any,
) -> mx.array:
    """`mx.fast.scaled_dot_product_attention`'s contract; numpy for a prefill's float32 attention."""
    assert _mlx_attention is not None, "install() first"
    if not _same_computation(queries, keys, values, mask, sinks, options):
        return _mlx_attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks, **options)
    if not _large_enough(queries, keys.shape[2]):
        if queries.shape[0] * queries.shape[1] * queries.shape[2] * keys.shape[2] >= _MIN_LAZY_SCORES:
            return lazy_attention(queries, keys, values, scale, mask)
        return _mlx_attention(queries, keys, values, scale=scale, mask=mask)
    arrays = [queries, keys, values] + ([mask] if isinstance(mask, mx.array) else [])
    mx.eval(*arrays)
    numpy_mask = np.asarray(mask) if isinstance(mask, mx.array) else mask
    return mx.array(_attend(np.asarray(queries), np.asarray(keys), np.asarray(values), scale, numpy_mask))


def quantized_attention(
    queries: mx.array,
    q_keys: tuple[mx.array, mx.array, mx.array],
    q_values: tuple[mx.array, mx.array, mx.array],
    scale: float,
    mask: mx.array | str | None,
    group_size: int = 64,
    bits: int = 8,
) -> mx.array:
    """mlx-lm's attention over a quantized KV cache (`MLX_RELAY_KV_BITS`): for a prefill chunk the keys and
    values are dequantized and attended in numpy (a verifying pass's too, once as large), since mlx-lm's own runs
    the same one-core softmax over every score; otherwise mlx-lm's function."""
    assert _mlx_quantized_attention is not None, "install() first"
    # A dequantize is built only for a pass large enough for `_taken`: never for a decode step (every layer of
    # every step), nor for a short verifying pass.
    if _large_enough(queries, q_keys[0].shape[-2]):
        keys = mx.dequantize(*q_keys, group_size=group_size, bits=bits)
        values = mx.dequantize(*q_values, group_size=group_size, bits=bits)
        if _taken(queries, keys, values, mask, None, {}):
            return attention(queries, keys, values, scale=scale, mask=mask)
    return _mlx_quantized_attention(queries, q_keys, q_values, scale, mask, group_size, bits)


def _taken(
    queries: mx.array, keys: mx.array, values: mx.array, mask: object, sinks: object, options: dict[str, Any]
) -> bool:
    """numpy's: the same computation, and large enough to pay for the pass's sync."""
    return _same_computation(queries, keys, values, mask, sinks, options) and _large_enough(queries, keys.shape[2])


def _same_computation(
    queries: mx.array, keys: mx.array, values: mx.array, mask: object, sinks: object, options: dict[str, Any]
) -> bool:
    """What numpy's and the lazy path compute as MLX does: float32, no sinks, whole groups of heads, and a mask that
    is absent, "causal" or an array."""
    if sinks is not None or options or queries.ndim != 4:
        return False
    if any(array.dtype != mx.float32 for array in (queries, keys, values)) or queries.shape[1] % keys.shape[1]:
        return False
    return mask is None or mask == "causal" if not isinstance(mask, mx.array) else mask.ndim <= 4


def _large_enough(queries: mx.array, key_count: int) -> bool:
    """Enough query rows and scores a sequence over `key_count` keys that numpy's work dwarfs the pass's sync.

    Per sequence, not per batch: each (sequence, KV head) is a block for the pool, and sixteen chat prompts of 25
    tokens are 48 blocks too small to pay for their dispatch (7.8 ms a layer against MLX's 1.8).
    """
    if queries.ndim != 4 or queries.shape[2] < _MIN_QUERY_ROWS:
        return False
    return bool(queries.shape[1] * queries.shape[2] * key_count >= _MIN_SCORES)


def _attend(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, mask: Any) -> np.ndarray:
    batch, heads, rows, _ = queries.shape
    kv_heads, context = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    out = np.empty((batch, heads, rows, values.shape[-1]), dtype=np.float32)
    block_rows = max(1, _BLOCK_SCORES // (group * context))
    blocks = [
        (b, h, start, min(rows, start + block_rows))
        for b in range(batch)
        for h in range(kv_heads)
        for start in range(0, rows, block_rows)
    ]

    def run(block: tuple[int, int, int, int]) -> None:
        b, h, start, stop = block
        heads_of_h = slice(h * group, (h + 1) * group)
        block_mask = _block_mask(mask, b, heads_of_h, start, stop, group)
        out[b, heads_of_h, start:stop] = _attend_block(
            queries[b, heads_of_h, start:stop], keys[b, h], values[b, h], scale, block_mask, rows - start, context
        )

    assert _pool is not None
    list(_pool.map(run, blocks))
    return out


def _attend_block(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    scale: float,
    mask: np.ndarray | str | None,
    rows_from_start: int,
    context: int,
) -> np.ndarray:
    """One KV head's group of query heads over a slice of rows: (group, block rows, head dim)."""
    group, block_rows, dim = queries.shape
    causal = isinstance(mask, str)
    seen = context
    if causal:
        # Row i of the chunk sees keys up to context - rows + i: this block's last row sees no further.
        seen = context - rows_from_start + block_rows
    scores = (queries.reshape(group * block_rows, dim) * np.float32(scale)) @ keys[:seen].T
    scores3 = scores.reshape(group, block_rows, seen)
    if causal:
        hidden = np.triu(np.ones((block_rows, block_rows), dtype=bool), 1)
        np.copyto(scores3[:, :, seen - block_rows :], np.float32(-np.inf), where=hidden)
    elif isinstance(mask, np.ndarray) and mask.dtype == np.bool_:
        # The finite floor, as mlx-lm's own masked softmax uses: a row whose keys are all hidden (left padding)
        # gets uniform weights, not NaNs that would reach the real rows through its values.
        np.copyto(scores3, np.finfo(np.float32).min, where=~mask)
    elif isinstance(mask, np.ndarray):
        scores3 += mask
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    weights = scores.sum(axis=-1, keepdims=True)
    attended = scores @ values[:seen]
    attended /= weights
    block: np.ndarray = attended.reshape(group, block_rows, dim)
    return block


def _block_mask(
    mask: np.ndarray | str | None, b: int, heads: slice, start: int, stop: int, group: int
) -> np.ndarray | str | None:
    """The block's part of a mask that broadcasts to (batch, heads, rows, context), as (group, rows, context)."""
    if not isinstance(mask, np.ndarray):
        return mask
    full = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    picked = full[b if full.shape[0] > 1 else 0, heads if full.shape[1] > 1 else slice(0, 1)]
    picked = picked[:, start:stop] if picked.shape[1] > 1 else picked
    return np.broadcast_to(picked, (group, stop - start, picked.shape[-1])) if picked.shape[0] == 1 else picked


def _threads() -> int:
    """The model's BLAS threads: the worker's share of the cores where the front set one (blas_share.py)."""
    named = environment_threads()
    if named is not None:
        return named
    return len(os.sched_getaffinity(0)) if sys.platform == "linux" else os.cpu_count() or 1


def _single_threaded_numpy_blas() -> None:
    """numpy's own OpenBLAS to one thread: the blocks are the parallelism, and its spinning threads would
    take cores from MLX's BLAS between the chunk's matmuls."""
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

    numpy_home = os.path.dirname(os.path.dirname(np.__file__))
    for library in ThreadpoolController().lib_controllers:
        if library.filepath.startswith(numpy_home) and "numpy" in library.filepath:
            library.set_num_threads(1)
