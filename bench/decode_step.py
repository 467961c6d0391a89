"""A decode step in process: mlx-lm's `GenerationBatch` against the gateway's `GreedyStepBatch`.

    python -m bench.decode_step [--model smollm2] [--rows 16,4] [--rounds 3] [--temperature 0]

mlx-lm normalizes every row's logits over the vocabulary before it samples; the gateway's batch takes a greedy
row's argmax, and draws a row that samples with temperature (min-p, top-k) from its logits, and leaves the
log-probabilities lazy (stages/model_thread/greedy_steps.py). Each round decodes the same rows (greedy, or each
with its own seeded sampler at `--temperature`) through both, alternating, and prints the wall and CPU
milliseconds a step, steps 5 on (the prompts' prefill and the first steps left out). The model is served as the
server serves it on a CPU: float32.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from stages.models.blas import preload_blas

preload_blas()

import attrs  # noqa: E402
from mlx_lm.generate import BatchGenerator  # noqa: E402

from pipeline.requests import Sampling  # noqa: E402
from stages.model_thread.sampling import make_row_sampler  # noqa: E402
from stages.model_thread.speculative_batch import speculating  # noqa: E402
from stages.models.loading import load_tokenizer, load_weights, resolve_model  # noqa: E402

_SKIPPED = 5


def _per_step(
    make: Callable[[], Any], prompts: list[list[int]], tokens: int, temperature: float
) -> tuple[float, float]:
    generator = make()
    samplers = [make_row_sampler(Sampling(temperature=temperature, seed=row)) for row in range(len(prompts))]
    generator.insert(prompts, max_tokens=[tokens] * len(prompts), samplers=samplers)
    steps, wall, cpu = 0, 0.0, 0.0
    while True:
        if not generator.next()[1]:
            if steps > _SKIPPED:
                break
            continue
        steps += 1
        if steps == _SKIPPED:
            wall, cpu = time.perf_counter(), time.process_time()
    generator.close()
    counted = steps - _SKIPPED
    return (time.perf_counter() - wall) / counted * 1000, (time.process_time() - cpu) / counted * 1000


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rows", default="16,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    info = resolve_model(args.model)
    model = load_weights(attrs.evolve(info, float32_weights=True))
    tokenizer = load_tokenizer(info)
    for rows in (int(r) for r in args.rows.split(",")):
        prompts = [
            tokenizer.encode(f"Request {row}: tell me about topic {row}, in a few plain sentences.")
            for row in range(rows)
        ]
        plain = partial(BatchGenerator, model, stop_tokens=[[-1]], completion_batch_size=rows, prefill_batch_size=rows)
        for _ in range(args.rounds):
            line = []
            for name, make in (("mlx-lm", plain), ("greedy", speculating(plain, None))):
                wall, cpu = _per_step(make, prompts, args.tokens, args.temperature)
                line.append(f"{name} {wall:.1f} ms ({cpu:.1f} ms CPU)")
            print(f"{args.model} N={rows} temperature {args.temperature}: " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()
