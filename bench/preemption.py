"""Preemption cost: the same streams with an ample KV budget and with one that forces preemption.

    python -m bench.preemption [--model tiny|demo|PATH] [--streams 16] [--max-tokens 540]

N greedy chat streams start together. The tight budget holds all N rows
while they are under 512 tokens (one cache block to grow), so as they
pass it the scheduler preempts the latest arrivals and resumes them from
the prompt cache. Prints one row per budget: wall time, generated
tokens/s, preemptions and resumptions from /stats, and whether every
stream's text matched the ample run; writes bench/out/preemption.json.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench import report
from bench.servers import free_port, relay_command, relay_env, started
from stages.kv.machine import read_machine
from stages.kv.plan import budget_for
from stages.kv.shape import read_model_shape
from stages.models.loading import resolve_model

OUT = Path(__file__).resolve().parent / "out"
DEMOS = frozenset({"demo", "tiny"})
PROMPT_CACHE = 256 << 20


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.preemption", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="demo, tiny (built locally), a model directory or a repo id")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams (default 16)")
    parser.add_argument("--max-tokens", type=int, default=540, help="tokens per stream; past 512 to force preemption")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def _stream(url: str, index: int, max_tokens: int) -> str:
    body = {
        "messages": [{"role": "user", "content": f"Tell me about {index}."}],
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=3600)
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


def _run(args: argparse.Namespace, name: str, env: dict[str, str]) -> dict[str, Any]:
    port = free_port()
    with started(f"relay-{name}", relay_command(port), port, env, args.out / "logs") as server:
        start = time.perf_counter()
        with ThreadPoolExecutor(args.streams) as pool:
            texts = list(pool.map(lambda i: _stream(server.url, i, args.max_tokens), range(args.streams)))
        wall = time.perf_counter() - start
        gateway = httpx.get(f"{server.url}/stats", timeout=10).json()["gateway"]
    tokens = args.streams * args.max_tokens
    return {
        "budget": name,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "preemptions": gateway["preemptions"],
        "resumed": gateway["resumed"],
        "texts": texts,
    }


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    info = resolve_model(None if args.model in DEMOS else args.model, demo=args.model, name=None)
    shape = read_model_shape(info.path, info.context_window)
    env = relay_env(args.model, DEMOS) | {
        "MLX_RELAY_PROMPT_CACHE_BYTES": str(PROMPT_CACHE),
        "MLX_RELAY_MAX_BATCH": str(args.streams),
    }
    tight = budget_for(
        shape,
        read_machine(),
        args.streams * shape.kv_bytes(512),
        prompt_cache=PROMPT_CACHE,
        max_batch=args.streams,
        prefill_step=512,
    )
    rows = [_run(args, "ample", env), _run(args, "tight", env | {"MLX_RELAY_MEMORY_BUDGET": str(tight)})]
    same = rows[0]["texts"] == rows[1]["texts"]
    header = ("budget", "wall s", "tok/s", "preempted", "resumed")
    table = [
        (
            row["budget"],
            f"{row['wall_s']:.1f}",
            f"{row['tokens_per_s']:.1f}",
            str(row["preemptions"]),
            str(row["resumed"]),
        )
        for row in rows
    ]
    summary = [{k: v for k, v in row.items() if k != "texts"} for row in rows]
    report.publish(
        args.out / "preemption.json", header, table, {"model": args.model, "rows": summary, "same_output": same}
    )
    print(f"cost of preemption: {rows[0]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x slower; same output: {same}")


if __name__ == "__main__":
    main()
