"""One row's decode cost, in process: mlx-lm's `generate_step`, its `BatchGenerator` at batch 1, and our `SingleRow`.

    python -m bench.single_row [--model tiny|demo|PATH] [--tokens 256] [--rounds 7]

No server, no HTTP: what each way of decoding a lone row costs the model
thread. The three run in turns, `--rounds` times (so a busy machine slows
each alike), and each reports the median and best wall milliseconds and
process CPU milliseconds per token; greedy, so all three must give the same
tokens (checked first). The gap between the batch and `generate_step` is
what `stages/model_thread/single_row.py` removes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.single_row", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="demo, tiny (built locally), or a model directory")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    from stages.models.blas import preload_blas

    blas = preload_blas()
    import mlx_lm

    from stages.models.demo import DEMO_MODELS, ensure_demo_model

    path = str(ensure_demo_model(args.model)) if args.model in DEMO_MODELS else args.model
    model, tokenizer = mlx_lm.load(path)[:2]
    prompt = tokenizer.encode("Tell me a story about a dragon and a knight in a small village, please.")
    ways = _ways(model, prompt, args.tokens)
    outputs = {name: run() for name, run in ways.items()}
    same = len({tuple(tokens) for tokens in outputs.values()}) == 1
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, run in ways.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            timings[name].append(
                ((time.perf_counter() - wall) / args.tokens * 1e3, (time.process_time() - cpu) / args.tokens * 1e3)
            )
    print(f"{args.model}, {args.tokens} tokens, {args.rounds} rounds, BLAS {blas}; same tokens: {same}")
    print(f"{'way':>16}  {'wall ms/tok med':>15}  {'best':>6}  {'CPU ms/tok med':>14}  {'best':>6}")
    for name, rows in timings.items():
        walls, cpus = [w for w, _ in rows], [c for _, c in rows]
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(f"{name:>16}  {wall:15.3f}  {min(walls):6.3f}  {cpu:14.3f}  {min(cpus):6.3f}")


def _ways(model: Any, prompt: list[int], tokens: int) -> dict[str, Callable[[], list[int]]]:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator, generate_step

    from stages.model_thread.single_row import single_row

    def batch() -> BatchGenerator:
        return BatchGenerator(model, stop_tokens=[[]], completion_batch_size=1, prefill_batch_size=1)

    def drive(generator: Any) -> list[int]:
        generator.insert([prompt], max_tokens=[tokens], all_tokens=[[]])
        out: list[int] = []
        while not out or len(out) < tokens:
            out += [response.token for response in generator.next()[1]]
        generator.close()
        return out

    def solo() -> Any:
        return single_row(batch, enabled=True, model=model, stop_tokens=[[]], prefill_step_size=2048)()

    return {
        "generate_step": lambda: [int(token) for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens)],
        "BatchGenerator": lambda: drive(batch()),
        "SingleRow": lambda: drive(solo()),
    }


if __name__ == "__main__":
    main()
