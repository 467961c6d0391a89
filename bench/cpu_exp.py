"""The CPU's exponentials: MLX's own against stages/models/cpu_exp.py's, per element, per attention, per forward pass.

    python -m bench.cpu_exp [--model smollm2] [--rounds 3] [--parts elements,attention,model]

`elements`: ns an element of `mx.exp`, mlx-lm's `swiglu` and a GELU-gated product, against ours.
`attention`: MLX's unfused attention against `lazy_attention`, the speed-up over a grid of batch, query rows and
keys on SmolLM2's and Gemma 3's heads; it is what sets `cpu_attention._MIN_LAZY_SCORES`.
`model`: the served model's forward pass (float32, as a CPU serves it), a 512-token prefill chunk and decode
steps at several batch sizes and contexts, with MLX's own activations and attention against ours, in alternating
rounds in one process; each line is the median ms and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from stages.models.blas import preload_blas

preload_blas()

import attrs  # noqa: E402
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models import activations  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache  # noqa: E402

from stages.models import cpu_attention, cpu_exp  # noqa: E402
from stages.models.loading import load_weights, resolve_model  # noqa: E402


def _ms(run: Callable[[], Any], repeats: int) -> float:
    for _ in range(2):
        mx.eval(run())
    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(run())
    return (time.perf_counter() - start) / repeats * 1000


def elements() -> None:
    gate, up = mx.random.normal((1, 512, 1536)) * 4, mx.random.normal((1, 512, 1536))
    below = -mx.abs(gate) * 10
    mx.eval(gate, up, below)
    per = 1e6 / gate.size
    pairs = {
        "exp": (lambda: mx.exp(below), lambda: cpu_exp.exp_nonpositive(below)),
        "swiglu": (lambda: activations.swiglu(gate, up), lambda: cpu_exp.swiglu(gate, up)),
        "gelu_approx(gate) * up": (lambda: nn.gelu_approx(gate) * up, lambda: cpu_exp.geglu(gate, up)),
    }
    for name, (theirs, ours) in pairs.items():
        mlx_ns, our_ns = _ms(theirs, 20) * per, _ms(ours, 20) * per
        print(f"{name}: MLX {mlx_ns:.1f} ns an element, ours {our_ns:.1f} ({mlx_ns / our_ns:.2f}x)", flush=True)


def attention() -> None:
    mlx_attention = cpu_attention.mlx_attention()
    for name, heads, kv_heads, dim in (("smollm2", 9, 3, 64), ("gemma3", 4, 1, 256)):
        for rows in (1, 2, 9):
            for batch in (1, 4, 16):
                cells = []
                for keys in (128, 256, 512, 768, 1024, 2048):
                    q = mx.random.normal((batch, heads, rows, dim))
                    k, v = (mx.random.normal((batch, kv_heads, keys, dim)) for _ in range(2))
                    mask = "causal" if rows > 1 else None
                    mx.eval(q, k, v)
                    theirs = _ms(partial(mlx_attention, q, k, v, scale=0.1, mask=mask), 30)
                    ours = _ms(partial(cpu_exp.lazy_attention, q, k, v, 0.1, mask), 30)
                    cells.append(f"{keys}:{theirs / ours:.2f}x")
                print(f"{name} rows={rows} batch={batch}: " + " ".join(cells), flush=True)


def model(name: str, rounds: int) -> None:
    info = resolve_model(name)
    served = load_weights(attrs.evolve(info, float32_weights=True))
    cases: dict[str, Callable[[], None]] = {"prefill 512": _prefill(served, 512)}
    for batch, context in ((1, 100), (1, 2000), (4, 1300), (16, 100)):
        cases[f"decode batch {batch} at {context}"] = _decode(served, batch, context)
    timings: dict[tuple[str, bool], list[float]] = {}
    for round_index in range(rounds):
        for ours in (round_index % 2 == 0, round_index % 2 == 1):
            _use_ours(ours)
            for case, run in cases.items():
                timings.setdefault((case, ours), []).append(_ms(run, 3 if case.startswith("prefill") else 10))
    for case in cases:
        theirs, ours = (statistics.median(timings[case, flag]) for flag in (False, True))
        print(f"{name} {case}: MLX's {theirs:.1f} ms, ours {ours:.1f} ms ({theirs / ours:.2f}x)", flush=True)


def _use_ours(ours: bool) -> None:
    """Ours everywhere `install` put them, or MLX's own again, in this process."""
    cpu_attention._MIN_LAZY_SCORES = _LAZY_GATE if ours else 1 << 62
    cpu_exp.use(ours=ours)


_LAZY_GATE = cpu_attention._MIN_LAZY_SCORES


def _prefill(served: Any, tokens: int) -> Callable[[], None]:
    def run() -> Any:
        cache = make_prompt_cache(served)
        return served(mx.arange(tokens)[None] % 1000 + 5, cache=cache)

    return run


def _decode(served: Any, batch: int, context: int) -> Callable[[], None]:
    cache = make_prompt_cache(served)
    mx.eval(served(mx.repeat(mx.arange(context)[None] % 1000 + 5, batch, axis=0), cache=cache))

    def run() -> Any:
        logits = served(mx.full((batch, 1), 7), cache=cache)
        mx.eval(logits)
        trim_prompt_cache(cache, 1)
        return logits

    return run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_exp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--parts", default="elements,attention,model")
    args = parser.parse_args()
    cpu_attention.install()
    parts = args.parts.split(",")
    if "elements" in parts:
        elements()
    if "attention" in parts:
        attention()
    if "model" in parts:
        for name in args.model.split(","):
            model(name, args.rounds)


if __name__ == "__main__":
    main()
