"""Decode and prefill tokens/s of one model in each form of its weights, on MLX's CPU backend.

    python -m bench.weight_forms [--model shaped:qwen3-0.6b-2l] [--prompt 32] [--decode 16] [--rounds 2]

The figures behind `stages/engine/weight_forms.py`'s `CPU_DECODE_SPEED`:
the model as stored (4-bit), and dequantized to float32, bfloat16 and
float16 as the server loads them (`load_weights`). The BLAS is the
server's (`preload_blas`, before `mlx` is imported); float32 matmuls go to
it, the 4-bit and 16-bit ones to MLX's own kernels. Prefill is one forward
pass over `--prompt` random tokens; decode is `--decode` one-token steps
after it. The forms run in turns, best of `--rounds`, so a busy machine
slows each alike; ratios are to the stored form.
"""

from __future__ import annotations

import argparse
import time

from stages.models.blas import preload_blas

FORMS = ("stored", "float32", "bfloat16", "float16")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.weight_forms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="shaped:qwen3-0.6b-2l")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    blas = preload_blas()
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for form in FORMS:
            prefill, decode = _run(args.model, form, args.prompt, args.decode)
            kept = best.get(form, (0.0, 0.0))
            best[form] = (max(kept[0], prefill), max(kept[1], decode))
    base = best["stored"]
    print(f"{args.model}, {args.prompt}-token prompt, {args.decode} decode steps, best of {args.rounds}; BLAS: {blas}")
    print(f"{'weights':<9} {'prefill tok/s':>14} {'x':>6} {'decode tok/s':>13} {'x':>6}")
    for form, (prefill, decode) in best.items():
        print(f"{form:<9} {prefill:>14.1f} {prefill / base[0]:>6.2f} {decode:>13.1f} {decode / base[1]:>6.2f}")


def _run(name: str, form: str, prompt: int, decode: int) -> tuple[float, float]:
    import attrs
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from stages.models.loading import load_weights, resolve_model

    info = attrs.evolve(
        resolve_model(name),
        float32_weights=form == "float32",
        sixteen_bit_weights=form if form in ("bfloat16", "float16") else None,
    )
    model = load_weights(info)
    tokens = mx.random.randint(0, info.vocab_size, (1, prompt), key=mx.random.key(0))
    mx.eval(model(tokens[:, :4], cache=make_prompt_cache(model)))  # type: ignore[operator]  # warm-up
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    logits = model(tokens, cache=cache)  # type: ignore[operator]
    mx.eval(logits)
    prefill = prompt / (time.perf_counter() - start)
    token = mx.argmax(logits[:, -1:], axis=-1)
    start = time.perf_counter()
    for _ in range(decode):
        token = mx.argmax(model(token, cache=cache)[:, -1:], axis=-1)  # type: ignore[operator]
        mx.eval(token)
    return prefill, decode / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
