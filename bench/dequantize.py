"""Dequantizing at load (issue #37): MLX's `dequantize` against stages/models/dequantize.py, on this CPU.

    python -m bench.dequantize [--model gemma3] [--rows 4096] [--rounds 3]

Two figures. One matrix of `--rows` x 4096 values, 4 bits in groups of 64 with float16, bfloat16 and float32 scales,
and each other width MLX packs with float16 scales: ns per value of `mx.dequantize(...).astype(float32)` and of
`dequantized`, each result checked to be the same bits, each run from an emptied MLX buffer cache as a load is. And
`--model` loaded as the server would serve it here (the weights' form from the memory plan under the default
settings): `load_weights` before issue #37 (mlx-lm's `dequantize_model`, then `set_dtype`) and now, in turns, best
of `--rounds`, with the weights checked equal.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from stages.models.blas import preload_blas

# (bits, group size, the scales' dtype): the matrix the issue names in each scale dtype, then every other width MLX
# packs, with the float16 scales of a GGUF conversion (the built-in models').
CASES = (
    (4, 64, "float16"),
    (4, 64, "bfloat16"),
    (4, 64, "float32"),
    (2, 64, "float16"),
    (3, 64, "float16"),
    (5, 32, "float16"),
    (6, 64, "float16"),
    (8, 32, "float16"),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dequantize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3")
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"BLAS: {preload_blas()}")
    _matrices(args.rows, args.rounds)
    _model(args.model, args.rounds)


def _best(run: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    import mlx.core as mx

    times, result = [], None
    for _ in range(rounds):
        # Each run starts as a load does, with no buffers of the last one cached.
        result = None
        mx.clear_cache()
        start = time.perf_counter()
        result = run()
        mx.eval(result)
        times.append(time.perf_counter() - start)
    return min(times), result


def _matrices(rows: int, rounds: int) -> None:
    import mlx.core as mx

    print(f"\n{rows} x 4096 to float32: ns per value, best of {rounds}")
    print(f"{'bits':>4} {'group':>5} {'scales':>8} {'mx.dequantize':>14} {'ours':>7} {'x':>6}")
    for bits, group, scales in CASES:
        mx.random.seed(bits)
        weight = mx.random.normal((rows, 4096)).astype(getattr(mx, scales))
        quantized = (*mx.quantize(weight, group, bits), group, bits)
        mx.eval(quantized[:3])
        ours, got = _best(partial(_ours, *quantized), rounds)
        theirs, expected = _best(partial(_theirs, *quantized), rounds)
        assert mx.array_equal(expected.view(mx.uint32), got.view(mx.uint32)).item(), (bits, group)
        per = 1e9 / (rows * 4096)
        print(f"{bits:>4} {group:>5} {scales:>8} {theirs * per:>14.2f} {ours * per:>7.2f} {theirs / ours:>6.1f}")


def _ours(words: Any, scales: Any, biases: Any, group: int, bits: int) -> Any:
    import mlx.core as mx

    from stages.models.dequantize import dequantized

    return dequantized(words, scales, biases, group, bits, mx.float32)


def _theirs(words: Any, scales: Any, biases: Any, group: int, bits: int) -> Any:
    import mlx.core as mx

    return mx.dequantize(words, scales, biases, group, bits).astype(mx.float32)


def _model(name: str, rounds: int) -> None:
    from mlx.utils import tree_flatten

    from pipeline.settings import Settings
    from stages.engine.decisions import plan_memory
    from stages.models.loading import load_weights, resolve_model

    settings = Settings()
    info, _, form = plan_memory(settings, resolve_model(name), adapter_bytes=0, cluster=None)
    served = "float32" if info.float32_weights else info.sixteen_bit_weights
    if served is None:
        print(f"\n{name}: served as stored ({form.served}); nothing is dequantized")
        return
    before: list[float] = []
    after: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        reference = _load_before(info.path, served)
        before.append(time.perf_counter() - start)
        start = time.perf_counter()
        model: Any = load_weights(info)
        after.append(time.perf_counter() - start)
        ours, theirs = tree_flatten(model.parameters()), tree_flatten(reference.parameters())
        assert all(_same(left, right) for (_, left), (_, right) in zip(ours, theirs, strict=True))
        del model, reference
    print(f"\n{name} load_weights, served as {served}: best of {rounds}")
    ratio = min(before) / min(after)
    print(f"before (mlx-lm's dequantize_model) {min(before):6.2f} s   now {min(after):6.2f} s   x {ratio:.1f}")


def _load_before(path: Any, served: str) -> Any:
    """`load_weights` as it was before issue #37."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, load_model

    model, _ = load_model(path)
    model = dequantize_model(model)
    model.set_dtype(getattr(mx, served))
    mx.eval(model.parameters())
    return model


def _same(left: Any, right: Any) -> bool:
    import mlx.core as mx

    unsigned = {2: mx.uint16, 4: mx.uint32}[left.dtype.size]
    return bool(left.dtype == right.dtype and mx.array_equal(left.view(unsigned), right.view(unsigned)).item())


if __name__ == "__main__":
    main()
