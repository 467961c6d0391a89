"""Two checkouts' servers side by side, in alternating rounds: CPU per 1,000 tokens of each one's front and worker.

    python -m bench.worker_ab --base /work/main [--model tiny] [--concurrency 1,16] [--rounds 3]

Starts mlx-relay from `--base` (say, main) and from this checkout, both
idle beside each other with a model worker each, then for each level N
runs rounds that alternate the two: N streaming clients, each sending
`--requests` completions of `--max-tokens` tokens (temperature 0,
`ignore_eos`), while only that server works. Each round reads the
server's front and worker CPU from /proc (bench/cpu.py), so a machine
whose load drifts weighs on both alike; prints the median of the rounds
per variant. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
from pathlib import Path

import httpx

from bench.cpu import tree_cpu_split
from bench.servers import REPO, Server, free_port, relay_command, relay_env, stop, wait_healthy
from bench.workload import wave_prompts
from stages.models.demo import DEMO_MODELS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (its server is variant A)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2, help="requests each client sends in turn, a round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("/tmp/worker_ab"))
    return parser


async def _client(client: httpx.AsyncClient, url: str, prompts: list[str], max_tokens: int) -> int:
    tokens = 0
    for text in prompts:
        body = {
            "model": "m",
            "prompt": text,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {") and (usage := json.loads(line[6:]).get("usage")):
                    tokens += usage["completion_tokens"]
    return tokens


async def _round(server: Server, level: int, index: int, args: argparse.Namespace) -> tuple[int, float, float]:
    assert server.process is not None
    before = tree_cpu_split(server.process.pid)
    prompts = [wave_prompts(level, index * args.requests + request) for request in range(args.requests)]
    async with httpx.AsyncClient(timeout=600) as client:
        counts = await asyncio.gather(
            *(_client(client, server.url, [wave[c] for wave in prompts], args.max_tokens) for c in range(level))
        )
    after = tree_cpu_split(server.process.pid)
    assert before is not None and after is not None
    return sum(counts), after[0] - before[0], after[1] - before[1]


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    servers: dict[str, Server] = {}
    try:
        for name, root in (("A", args.base.resolve()), ("B", REPO)):
            port = free_port()
            log_path = args.out / f"{name}.log"
            with log_path.open("wb") as log:
                env = relay_env(args.model, DEMO_MODELS)
                process = subprocess.Popen(relay_command(port), cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
            servers[name] = Server(f"{name} ({root})", f"http://127.0.0.1:{port}", process, log_path)
            wait_healthy(servers[name])
        for server in servers.values():
            asyncio.run(_round(server, 1, 10_000, argparse.Namespace(**{**vars(args), "requests": 1})))  # warm-up
        print(f"s per 1,000 tokens, median of {args.rounds} alternating rounds (front / worker / both):")
        for level in levels:
            figures: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
            for index in range(args.rounds):
                for name, server in servers.items():
                    tokens, front, worker = asyncio.run(_round(server, level, index, args))
                    figures[name].append((front / tokens * 1000, worker / tokens * 1000))
            for name, server in servers.items():
                front = statistics.median(f for f, _ in figures[name])
                worker = statistics.median(w for _, w in figures[name])
                both = statistics.median(f + w for f, w in figures[name])
                print(f"N={level:<3} {server.name}: {front:.3f} / {worker:.3f} / {both:.3f}")
    finally:
        for server in servers.values():
            if server.process is not None:
                stop(server.process)


if __name__ == "__main__":
    main()
