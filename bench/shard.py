"""Sharding's overhead on one machine: decode tokens/s and the step message's collective, 1 rank vs N.

    python -m bench.shard [--model demo] [--ranks 2] [--rows 1,8] [--tokens 64]

On one machine this can only show what sharding costs, never what it
gains: N ranks split the same cores and memory bandwidth that one process
had to itself, and every layer adds an all_sum over loopback. The gain
(a model larger than one machine, or N machines' bandwidth) needs N hosts.

For each batch size, greedy rows (sampled on every rank) and seeded rows
(sampled on rank 0, their token summed into every rank's step) decode
`--tokens` tokens each, through mlx-lm's `BatchGenerator` in one process
and through `ReplicatedGenerator` with N-1 followers (ranks over the ring
backend on loopback, started as `mlx.launch` starts them). Reported per
run: decode tokens/s, and the step message's `all_sum` per step, both
alone (`ping_us`: an empty message, nothing else queued) and in the run
(`step_us`: it also waits for the step queued before it on the same
stream). Writes bench/out/shard.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"
PROMPT = [list(range(10 + row, 40 + row)) for row in range(64)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.shard", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny, shaped:<name> or a model directory")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rows", default="1,8", help="batch sizes, comma-separated")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each row decodes")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def _samplers(rows: int, seeded: bool) -> list[Any]:
    from mlx_lm.sample_utils import greedy_sampler

    from pipeline.requests import Sampling
    from stages.model_thread.sampling import KeyedSampler

    return [KeyedSampler(Sampling(temperature=0.8, seed=row)) if seeded else greedy_sampler for row in range(rows)]


def decode(generator: Any, rows: int, tokens: int, seeded: bool) -> dict[str, float]:
    """Tokens/s after every row has its first token (prefill excluded)."""
    generator.insert(
        PROMPT[:rows],
        max_tokens=[tokens] * rows,
        caches=None,
        all_tokens=[[] for _ in range(rows)],
        samplers=_samplers(rows, seeded),
        logits_processors=[[] for _ in range(rows)],
    )
    produced, started, counted, steps = 0, 0.0, 0, 0
    channel = getattr(generator, "channel", None)
    before = (channel.seconds, channel.calls) if channel is not None else (0.0, 0)
    while produced < rows * tokens:
        _, generated = generator.next()
        produced += len(generated)
        if started == 0.0 and produced >= rows:
            started, counted = time.perf_counter(), produced
        elif started:
            steps += 1
    elapsed = time.perf_counter() - started
    result = {"rows": rows, "seeded": seeded, "tokens_per_s": round((produced - counted) / elapsed, 1)}
    if channel is not None:
        result["step_us"] = round((channel.seconds - before[0]) / max(1, channel.calls - before[1]) * 1e6, 1)
    return result


def ping(channel: Any, count: int = 100) -> float:
    """Microseconds per empty step message, with nothing else queued."""
    started = time.perf_counter()
    for _ in range(count):
        channel.send({"ops": [], "check": []})
    return round((time.perf_counter() - started) / count * 1e6, 1)


def runs(generator: Any, args: argparse.Namespace) -> list[dict[str, float]]:
    sizes = [int(size) for size in args.rows.split(",")]
    decode(generator, 1, 4, False)  # warm-up
    return [decode(generator, rows, args.tokens, seeded) for rows in sizes for seeded in (False, True)]


def single(path: Path, args: argparse.Namespace) -> list[dict[str, float]]:
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    size = max(int(size) for size in args.rows.split(","))
    return runs(BatchGenerator(model, stop_tokens=[], completion_batch_size=size, prefill_batch_size=size), args)


def rank(path: Path, args: argparse.Namespace) -> None:
    from stages.shard.cluster import join
    from stages.shard.follower import Follower

    cluster = join("tensor", timeout=60)
    model = cluster.load(path)
    if cluster.rank != 0:
        Follower(model, cluster.group).run()
        return
    size = max(int(size) for size in args.rows.split(","))
    generator = cluster.make_generator(model, stop_tokens=[], completion_batch_size=size, prefill_batch_size=size)
    ping_us = ping(generator.channel)
    results = runs(generator, args)
    generator.close()
    print(json.dumps({"ping_us": ping_us, "runs": results}), flush=True)


def sharded(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from bench.servers import free_port

    hostfile = out / "shard-hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(args.ranks)]))
    command = [sys.executable, "-m", "bench.shard", *sys.argv[1:]]
    env = {**os.environ, "MLX_HOSTFILE": str(hostfile)}
    ranks = [
        subprocess.Popen(command, env={**env, "MLX_RANK": str(r)}, stdout=subprocess.PIPE, text=True)
        for r in range(args.ranks)
    ]
    output, _ = ranks[0].communicate(timeout=1800)
    for process in ranks[1:]:
        process.wait(timeout=60)
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    from stages.models.blas import preload_blas

    preload_blas()
    from stages.models.loading import resolve_model

    args = _parser().parse_args(argv)
    path = resolve_model(args.model).path
    if "MLX_RANK" in os.environ:
        rank(path, args)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    one = single(path, args)
    many = sharded(args, args.out)
    print(f"model {args.model}; {args.ranks} ranks on ONE machine: overhead only, not the gain of more hosts")
    print(f"step message alone (empty all_sum of a 4 KiB frame): {many['ping_us']} us")
    ranks = f"{args.ranks} ranks tok/s"
    print(f"{'rows':>4} {'sampling':>8} {'1 rank tok/s':>13} {ranks:>14} {'ratio':>6} {'step msg us':>12}")
    for a, b in zip(one, many["runs"]):
        kind = "seeded" if a["seeded"] else "greedy"
        ratio = b["tokens_per_s"] / a["tokens_per_s"]
        print(
            f"{a['rows']:>4} {kind:>8} {a['tokens_per_s']:>13} {b['tokens_per_s']:>14} {ratio:>6.2f} {b['step_us']:>12}"
        )
    (args.out / "shard.json").write_text(
        json.dumps({"model": args.model, "ranks": args.ranks, "single": one, "sharded": many}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
