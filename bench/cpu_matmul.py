"""A linear layer's product at a few rows, in MLX's orientation and flipped (stages/models/cpu_matmul.py).

    python -m bench.cpu_matmul [--parts shapes,model] [--model smollm2,gemma3] [--rounds 6]

`shapes`: each linear shape of SmolLM2 and Gemma 3, at 1 to 64 rows, `x @ W.T` against `(W @ x.T).T`, over enough
copies of the weight that a call reads it from memory, as a decode step does (µs a call, medians of 5).
`model`: the model as the server serves it on this backend (float32 on a CPU, its orientations measured at load),
a forward pass over a 1,000-token cache at 1 to 8 rows and at verifying passes, with the flipped products and with
none, alternating in one process (ms, medians of `--rounds`). The BLAS threads are the environment's
(`MKL_NUM_THREADS`; all cores where unset), as in a server.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

SHAPES = {
    "SmolLM2 q, o": (576, 576),
    "SmolLM2 k, v": (576, 192),
    "SmolLM2 gate, up": (576, 1536),
    "SmolLM2 down": (1536, 576),
    "SmolLM2 output (tied)": (576, 49152),
    "Gemma 3 q": (640, 1024),
    "Gemma 3 gate, up": (640, 2048),
    "Gemma 3 down": (2048, 640),
    "Gemma 3 output (tied)": (640, 262144),
}
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 36, 64)
# Copies read in turn, about 64 MB: past the last-level cache, as a step's weights are.
_BYTES_READ = 64 << 20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_matmul", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="shapes,model")
    parser.add_argument("--model", default="smollm2,gemma3")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    from stages.models.blas import preload_blas

    print(f"BLAS: {preload_blas()}")
    parts = args.parts.split(",")
    if "shapes" in parts:
        _shapes()
    if "model" in parts:
        for name in args.model.split(","):
            _model(name, args.rounds)


def _shapes() -> None:
    import mlx.core as mx

    from stages.models.cpu_matmul import flipped_product

    print("\nµs a call, MLX's x @ W.T / flipped (W @ x.T).T:")
    print("| shape (in → out) | " + " | ".join(f"{rows} rows" for rows in ROWS) + " |")
    print("| --- | " + " | ".join("---:" for _ in ROWS) + " |")
    for name, (inputs, outputs) in SHAPES.items():
        copies = max(1, _BYTES_READ // (4 * inputs * outputs))
        weights = [mx.random.normal((outputs, inputs)) for _ in range(copies)]
        mx.eval(weights)
        cells = []
        for rows in ROWS:
            x = mx.random.normal((rows, inputs))
            theirs = _median_call(lambda: [x @ w.T for w in weights], len(weights))  # noqa: B023  # used at once
            ours = _median_call(lambda: [flipped_product(x, w) for w in weights], len(weights))  # noqa: B023
            cells.append(f"{theirs:.0f} / {ours:.0f}")
        print(f"| {name} ({inputs} → {outputs}) | " + " | ".join(cells) + " |", flush=True)


def _median_call(run: Callable[[], list[object]], calls: int) -> float:
    import mlx.core as mx

    mx.eval(run())
    times = []
    for _ in range(5):
        began = time.perf_counter()
        mx.eval(run())
        times.append((time.perf_counter() - began) / calls * 1e6)
    return statistics.median(times)


def _model(name: str, rounds: int) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from bench.speculation import _load
    from stages.models.cpu_matmul import OrientedEmbedding, OrientedLinear

    model, _ = _load(name)
    layers = [module for _, module in model.named_modules() if isinstance(module, OrientedLinear | OrientedEmbedding)]
    chosen = [layer.flipped_rows for layer in layers]
    print(f"\n{name}: a forward pass over a 1,000-token cache, MLX's products / flipped where measured faster:")
    print("| rows | passes | MLX's | flipped | ratio |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for batch, positions in [
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 1),
        (6, 1),
        (8, 1),
        (16, 1),
        (1, 3),
        (1, 5),
        (4, 2),
        (4, 4),
        (4, 8),
    ]:
        cache = make_prompt_cache(model)
        context = mx.array([[1000 + index % 500 for index in range(1000)]] * batch)
        for start in range(0, 1000, 250):
            model(context[:, start : start + 250], cache=cache)
            mx.eval([layer_cache.state for layer_cache in cache])
        step = mx.array([[5 + position for position in range(positions)]] * batch)
        times: dict[bool, list[float]] = {False: [], True: []}
        for round_ in range(rounds):
            for flipped in (round_ % 2 == 0, round_ % 2 == 1):
                for layer, rows in zip(layers, chosen, strict=True):
                    layer.flipped_rows = rows if flipped else frozenset()
                began = time.perf_counter()
                mx.eval(model(step, cache=cache))
                times[flipped].append(time.perf_counter() - began)
                for layer_cache in cache:
                    layer_cache.offset -= positions
        theirs, ours = (statistics.median(times[flipped][1:]) * 1e3 for flipped in (False, True))
        shape = f"{batch} × {positions}"
        print(f"| {batch * positions} | {shape} | {theirs:.0f} | {ours:.0f} | {theirs / ours:.2f}× |", flush=True)
    for layer, rows in zip(layers, chosen, strict=True):
        layer.flipped_rows = rows


if __name__ == "__main__":
    main()
