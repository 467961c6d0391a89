"""A lone prompt's prefill at several chunk sizes, in one process, rounds alternating: wall and CPU seconds.

    python -m bench.prefill_chunk [--model smollm2] [--tokens 2048] [--cached 0] [--chunks 256,512,2048] [--rounds 3]
                                  [--attention numpy,mlx]

mlx-relay prefills a prompt with nothing beside it in `prefill_step_size`
chunks (512 by default; stages/model_thread/step_budget.py), mlx-lm's
`stream_generate` and `mlx_lm.server` in 2,048. A chunk's attention scores
are chunk x context, so a larger chunk does fewer passes over the weights
but more work per token in attention, whose softmax runs on one core on
the CPU backend. This runs the model's forward pass over one fresh prompt
of `--tokens` tokens (after `--cached` tokens already in the cache, as
an agent's next turn finds its conversation), chunk by chunk as the batch does, for each size in
turn (the order rotating each round), and prints each one's wall and
process CPU seconds, each round and the median. `--attention` crosses the
sizes with the CPU backend's attention: `numpy`, mlx-relay's
(stages/models/cpu_attention.py), and `mlx`, MLX's own. Linux or macOS; a built-in
name is served as mlx-relay serves it (its float32 copy on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.interleaved import _model_path

OUT = Path(__file__).resolve().parent / "out"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prefill_chunk", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--cached", type=int, default=0, help="tokens in the cache before the timed prefill")
    parser.add_argument("--chunks", default="256,512,2048")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attention", default="numpy", help="numpy, mlx or both (the CPU backend's attention)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    variants = [(int(size), kind) for size in args.chunks.split(",") for kind in args.attention.split(",")]
    from stages.models.blas import preload_blas

    # First: finding a built-in model's directory imports mlx, which binds its BLAS at that import.
    print(f"BLAS: {preload_blas()}", flush=True)
    path = _model_path(args.model, args.out)
    import mlx.core as mx  # only now: mlx binds its BLAS when it is first imported
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    from stages.models import cpu_attention

    cpu_attention.install()
    attentions = {"numpy": cpu_attention.attention, "mlx": cpu_attention.mlx_attention()}
    model = mlx_lm.load(path)[0]
    # Ids past the special tokens, never a repeat that a cache could shortcut: the prompt's content does not move
    # a forward pass's cost.
    total = args.cached + args.tokens
    prompt = mx.array([1, *range(100, 100 + total - 1)])

    def prefill(variant: tuple[int, str]) -> tuple[float, float]:
        chunk, kind = variant
        mx.fast.scaled_dot_product_attention = attentions[kind]
        cache = make_prompt_cache(model)
        for start in range(0, args.cached, 512):
            model(prompt[None, start : min(start + 512, args.cached)], cache=cache)
            mx.eval([layer.state for layer in cache])
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(args.cached, total, chunk):
            model(prompt[None, start : start + chunk], cache=cache)
            mx.eval([layer.state for layer in cache])
        return time.perf_counter() - wall, time.process_time() - cpu

    prefill(min(variants))  # warm-up: first calls pay one-time setup
    results: dict[tuple[int, str], list[tuple[float, float]]] = {variant: [] for variant in variants}
    for index in range(args.rounds):
        for variant in variants[index % len(variants) :] + variants[: index % len(variants)]:
            results[variant].append(prefill(variant))
        line = "  ".join(f"{_name(v)}: {results[v][-1][0]:.2f} s wall {results[v][-1][1]:.2f} s CPU" for v in variants)
        print(f"round {index + 1}: {line}", flush=True)
    print(f"\n{args.tokens} tokens after {args.cached} cached, median of {args.rounds} rounds:")
    for variant in variants:
        walls, cpus = zip(*results[variant], strict=True)
        print(f"  {_name(variant)}: {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} s CPU")


def _name(variant: tuple[int, str]) -> str:
    return f"chunk {variant[0]}, {variant[1]} attention"


if __name__ == "__main__":
    main()
