"""mlx-relay under several settings or trees, and mlx_lm.server, in alternating waves: CPU per token and tok/s.

    python -m bench.relay_variants --model smollm2 --concurrency 16,4 --rounds 3 \
        --variant 'new={}' --variant 'base={"_tree": "/path/to/other/checkout"}' \
        --variant 'bigchunk={"MLX_RELAY_STEP_BUDGET_MS": "10000"}' [--peer DIR]

Each variant is a name and a JSON object of environment variables for its
server (`_tree`: start that checkout's app instead of this one's). All stay
started; each round runs one wave (bench/load.py's clients, as
`bench.interleaved` sends them) on each, in an order that rotates from
round to round, and every ratio is taken against the first variant within
its round. `--peer` adds `mlx_lm.server` on that directory (say,
`bench.interleaved`'s float32 copy). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from contextlib import ExitStack
from pathlib import Path

from bench.interleaved import server_wave
from bench.load import warm_up
from bench.servers import REPO, Server, free_port, mlx_lm_command, relay_command, relay_env, started
from bench.workload import WARMUP_PROMPT, Workload
from stages.models.demo import DEMO_MODELS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_variants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", default="16,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above it every server samples")
    parser.add_argument("--variant", action="append", required=True, help="NAME=JSON (environment; _tree: checkout)")
    parser.add_argument("--peer", help="mlx_lm.server on this model directory, beside the variants")
    parser.add_argument("--out", type=Path, default=Path("/tmp/relay_variants"))
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    workload = Workload(
        concurrency=tuple(levels), max_tokens=args.max_tokens, requests_per_client=2, temperature=args.temperature
    )
    variants = dict(_variant(text) for text in args.variant)
    figures: dict[tuple[int, str], list[dict[str, float]]] = {}
    with ExitStack() as stack:
        started_servers = {name: _relay(stack, args, name, env) for name, env in variants.items()}
        if args.peer:
            port = free_port()
            command = mlx_lm_command(args.peer, port)
            started_servers["mlx_lm"] = stack.enter_context(started("mlx_lm", command, port, os.environ, args.out))
        for server in started_servers.values():
            asyncio.run(warm_up(server.url, WARMUP_PROMPT, args.max_tokens))
        names = list(started_servers)
        for index in range(args.rounds):
            for level in levels:
                order = names[index % len(names) :] + names[: index % len(names)]
                line = []
                for name in order:
                    wave = server_wave(started_servers[name], level, 1 + index, workload=workload, split=False)
                    figures.setdefault((level, name), []).append(wave)
                    line.append(f"{name} {wave['tok_s']:.1f} tok/s {wave['cpu']:.2f} s/1k")
                print(f"round {index + 1} N={level}: " + "  ".join(line), flush=True)
    first = names[0]
    for level in levels:
        for name in names:
            mine, base = figures[(level, name)], figures[(level, first)]
            tok_s = statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(mine, base, strict=True))
            cpu = statistics.median(a["cpu"] / b["cpu"] for a, b in zip(mine, base, strict=True))
            print(
                f"N={level} {name}: {statistics.median(f['tok_s'] for f in mine):.1f} tok/s, "
                f"{statistics.median(f['cpu'] for f in mine):.2f} s CPU/1k; against {first}: tok/s {tok_s:.2f}x, "
                f"CPU {cpu:.2f}x"
            )


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, environment = text.partition("=")
    return name, json.loads(environment or "{}")


def _relay(stack: ExitStack, args: argparse.Namespace, name: str, extra: dict[str, str]) -> Server:
    environment = relay_env(args.model, frozenset(DEMO_MODELS))
    environment.update({key: value for key, value in extra.items() if key != "_tree"})
    port = free_port()
    tree = Path(extra["_tree"]) if "_tree" in extra else REPO
    return stack.enter_context(started(name, relay_command(port), port, environment, args.out, cwd=tree))


if __name__ == "__main__":
    main()
