"""What serving LoRA adapters costs: mounting one, and rows of several adapters that cannot share a step.

    python -m bench.adapters [--model demo|tiny|PATH] [--rows 12] [--max-tokens 64]

Drives the gateway's generator directly (no HTTP), greedy, on one model
with two random adapters (`stages/models/demo_adapter.py`):
- `base`: all rows on the base model, mlx-lm's plain `BatchGenerator`;
- `one adapter`: all rows on adapter A (one group: LoRA's own cost);
- `three groups`: the rows split evenly over base, A and B, which take
  turns one step each (`stages/model_thread/adapter_batches.py`).
Prints wall time, generated tokens/s, steps, each row's mean gap between
tokens, and the mean time of one adapter switch (the module swap); writes
bench/out/adapters.json.
"""

from __future__ import annotations

from stages.models.blas import preload_blas

# Before anything imports mlx: the BLAS is chosen when mlx first loads.
BLAS = preload_blas()

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import attrs  # noqa: E402

from bench import report  # noqa: E402
from stages.adapters import read_adapters  # noqa: E402
from stages.model_thread.adapter_batches import AdapterBatches, make_generator  # noqa: E402
from stages.models.demo_adapter import write_random_adapter  # noqa: E402
from stages.models.loading import resolve_model  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


@attrs.frozen
class Result:
    scenario: str
    rows: int
    wall_s: float
    tokens_per_s: float
    steps: int
    mean_gap_ms: float
    switches: int
    switch_ms: float


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.adapters", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny (built locally) or a model directory")
    parser.add_argument("--rows", type=int, default=12, help="rows in flight at once (default 12)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per row (default 64)")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def run(scenario: str, model: Any, tokenizer: Any, adapters: str, groups: list[str | None], max_tokens: int) -> Result:
    from mlx_lm.generate import BatchGenerator

    make = partial(
        BatchGenerator, model, stop_tokens=[], completion_batch_size=len(groups), prefill_batch_size=len(groups)
    )
    generator = make_generator(model, read_adapters(adapters), make)
    prompts = [
        tokenizer.encode(f"Row {index} asks about the weather in a city far away.") for index in range(len(groups))
    ]
    for prompt, group in zip(prompts, groups):
        generator.insert([prompt], max_tokens=[max_tokens], **({"adapter": group} if group else {}))
    times: dict[int, list[float]] = {}
    steps, started = 0, time.perf_counter()
    while sum(len(t) for t in times.values()) < max_tokens * len(groups):
        _, generated = generator.next()
        steps += 1
        now = time.perf_counter()
        for response in generated:
            times.setdefault(response.uid, []).append(now)
    wall = time.perf_counter() - started
    gaps = [(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1]
    switches = generator.switches if isinstance(generator, AdapterBatches) else 0
    seconds = generator.switch_seconds if isinstance(generator, AdapterBatches) else 0.0
    generator.close()
    return Result(
        scenario=scenario,
        rows=len(groups),
        wall_s=round(wall, 3),
        tokens_per_s=round(max_tokens * len(groups) / wall, 1),
        steps=steps,
        mean_gap_ms=round(1000 * sum(gaps) / len(gaps), 2),
        switches=switches,
        switch_ms=round(1000 * seconds / switches, 3) if switches else 0.0,
    )


def main() -> None:
    import mlx_lm

    args = _parser().parse_args()
    path = resolve_model(args.model).path
    model, tokenizer = mlx_lm.load(str(path))
    with tempfile.TemporaryDirectory() as folder:
        spec = ",".join(
            f"{name}={write_random_adapter(path, Path(folder) / name, seed=seed)}"
            for name, seed in (("a", 1), ("b", 2))
        )
        rows = args.rows - args.rows % 3
        mixed: list[str | None] = [(None, "a", "b")[index % 3] for index in range(rows)]
        results = [
            run("base", model, tokenizer, "", [None] * rows, args.max_tokens),
            run("one adapter", model, tokenizer, spec, ["a"] * rows, args.max_tokens),
            run("three groups", model, tokenizer, spec, mixed, args.max_tokens),
        ]
    print(f"BLAS: {BLAS}")
    header = ("scenario", "rows", "wall s", "tok/s", "steps", "gap ms", "switches", "switch ms")
    table = [tuple(str(value) for value in attrs.astuple(r)) for r in results]
    payload = {
        "model": str(path),
        "blas": BLAS,
        "max_tokens": args.max_tokens,
        "results": [attrs.asdict(r) for r in results],
    }
    report.publish(args.out / "adapters.json", header, table, payload)


if __name__ == "__main__":
    main()
