"""Soak: memory under a long mixed load.

    python -m bench.soak [--minutes 10] [--clients 8] [--interval 5] [--model demo]

Starts mlx-relay on a free loopback port (or uses `--url` and `--pid`),
drives K clients over every API (bench/soak_load.py) for N minutes, and
every few seconds samples the server's resident memory (VmRSS of the
worker process) and `/stats`: the prompt cache's bytes and entries, the
response store's bytes, and MLX's own active and cached memory. Writes
bench/out/soak.csv, soak.json (a summary) and soak.png; stops by itself.

The question it answers: does RSS level off? The summary gives RSS at the
first sample after warm-up, the median of the last third, the end, and
the slope over the second half of the run in MB per minute; the same for
RSS less the prompt cache's own figure (`rss_less_cache_mb`), which must
level off too: what the cache counts is what it costs the process
(issue #22 item 7: a per-entry cost it left out grew 110 → 332 MiB).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port, relay_command, relay_env, started
from bench.soak_load import Client, Tally

OUT = Path(__file__).resolve().parent / "out"
MB = 1 << 20
COLUMNS = (
    "seconds",
    "rss_mb",
    "rss_less_cache_mb",
    "prompt_cache_mb",
    "prompt_cache_entries",
    "store_mb",
    "store_entries",
    "mx_active_mb",
    "mx_cache_mb",
    "requests",
    "errors",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs (default 10)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--max-tokens", type=int, default=48, help="the most tokens a request asks for (default 48)")
    parser.add_argument("--model", default="demo", help="demo, tiny, a model directory or a repo id")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra server setting (repeatable)"
    )
    parser.add_argument("--url", help="soak this running mlx-relay (loopback) instead of starting one; needs --pid")
    parser.add_argument("--pid", type=int, help="the process whose RSS to sample, with --url")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=OUT, help="where the CSV, JSON, plot and log go (default bench/out)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.url is not None:
        if args.pid is None:
            raise SystemExit("--url needs --pid (the server process to sample)")
        if not args.url.startswith(("http://127.0.0.1", "http://localhost")):
            raise SystemExit("--url must be a loopback address")
        rows, tally = asyncio.run(_soak(args, args.url, args.pid))
    else:
        from stages.models.demo import DEMO_MODELS

        env = relay_env(args.model, frozenset(DEMO_MODELS))
        env.update(item.split("=", 1) for item in args.env)
        port = free_port()
        with started("soak", relay_command(port), port, env, args.out / "logs") as server:
            assert server.process is not None
            rows, tally = asyncio.run(_soak(args, server.url, server.process.pid))
    _publish(args, rows, tally)


async def _soak(args: argparse.Namespace, url: str, pid: int) -> tuple[list[dict[str, float]], Tally]:
    tally = Tally()
    limits = httpx.Limits(max_connections=args.clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits) as http:
        # One request first, so the first sample shows a server that has served.
        warm = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
        (await http.post("/v1/chat/completions", json=warm)).raise_for_status()
        started_at = time.monotonic()
        deadline = started_at + args.minutes * 60
        clients = [
            Client(http, random.Random(args.seed * 1000 + n), args.max_tokens, tally) for n in range(args.clients)
        ]
        load = [asyncio.create_task(client.run(deadline)) for client in clients]
        rows = await _sample(http, pid, started_at, deadline, args.interval, tally)
        await asyncio.gather(*load)
        rows.append(await _row(http, pid, started_at, tally))
        tally.after = await _leftovers(http)
    return rows, tally


async def _leftovers(http: httpx.AsyncClient) -> dict[str, int]:
    """Per-request state still held once every client is done: all zero, or something leaks."""
    await asyncio.sleep(2.0)
    stats = (await http.get("/stats")).json()
    gateway = stats["gateway"]
    return {
        "admission_in_flight": stats["admission"]["in_flight"],
        "gateway_active": gateway["active"],
        "gateway_pending": gateway["pending"],
        "gateway_waiting_for_memory": gateway["waiting_for_memory"],
        "kv_held_bytes": gateway["kv_held_bytes"],
        "sink_rows": stats.get("sink_rows", -1),
    }


async def _sample(
    http: httpx.AsyncClient, pid: int, started_at: float, deadline: float, interval: float, tally: Tally
) -> list[dict[str, float]]:
    rows = []
    while time.monotonic() < deadline:
        rows.append(row := await _row(http, pid, started_at, tally))
        print(
            f"{row['seconds']:7.0f} s  rss {row['rss_mb']:7.1f} MB (less cache {row['rss_less_cache_mb']:7.1f})"
            f"  prompt cache {row['prompt_cache_mb']:6.1f} MB"
            f" ({row['prompt_cache_entries']:.0f})  store {row['store_mb']:5.1f} MB"
            f"  mx active {row['mx_active_mb']:6.1f}"
            f" cache {row['mx_cache_mb']:6.1f}  requests {row['requests']:.0f}  errors {row['errors']:.0f}",
            flush=True,
        )
        await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))
    return rows


async def _row(http: httpx.AsyncClient, pid: int, started_at: float, tally: Tally) -> dict[str, float]:
    stats = (await http.get("/stats")).json()
    cache = stats.get("prompt_cache") or {}
    store = stats.get("response_store") or {}
    gateway = stats.get("gateway") or {}
    rss, cached = worker_rss(pid) / MB, cache.get("bytes", 0) / MB
    return {
        "seconds": time.monotonic() - started_at,
        "rss_mb": rss,
        "rss_less_cache_mb": rss - cached,
        "prompt_cache_mb": cached,
        "prompt_cache_entries": cache.get("entries", 0),
        "store_mb": store.get("bytes", 0) / MB,
        "store_entries": store.get("entries", 0),
        "mx_active_mb": gateway.get("mlx_active_bytes", 0) / MB,
        "mx_cache_mb": gateway.get("mlx_cache_bytes", 0) / MB,
        "requests": tally.total,
        "errors": tally.errors,
    }


def worker_rss(pid: int) -> int:
    """The largest VmRSS among `pid` and its descendants: hypercorn serves from a child process."""
    return max(_rss(p) for p in _tree(pid))


def _tree(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                pass
    return found


def _rss(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    """RSS (and RSS less the prompt cache) at the start, its median over the last third, at the end, and its
    slope over the second half."""
    half = [row for row in rows if row["seconds"] >= rows[-1]["seconds"] / 2]
    summary: dict[str, float] = {}
    for column, name in (("rss_mb", "rss"), ("rss_less_cache_mb", "rss_less_cache")):
        values = [row[column] for row in rows]
        summary |= {
            f"{name}_start_mb": values[0],
            f"{name}_plateau_mb": statistics.median(values[-max(1, len(values) // 3) :]),
            f"{name}_end_mb": values[-1],
            f"{name}_peak_mb": max(values),
        }
    summary["second_half_slope_mb_per_min"] = _slope(half, "rss_mb")
    summary["rss_less_cache_second_half_slope_mb_per_min"] = _slope(half, "rss_less_cache_mb")
    return summary


def _slope(rows: list[dict[str, float]], column: str) -> float:
    if len(rows) < 2:
        return 0.0
    xs, ys = [row["seconds"] / 60 for row in rows], [row[column] for row in rows]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0


def _publish(args: argparse.Namespace, rows: list[dict[str, float]], tally: Tally) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "soak.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    summary: dict[str, Any] = {
        **summarize(rows),
        "minutes": args.minutes,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "model": args.model,
        "env": args.env,
        "machine": f"{platform.system()} {platform.machine()}, {_cpus()} CPUs",
        "requests": dict(tally.done),
        "failed": dict(tally.failed),
        "last_error": tally.last_error,
        "after_load": tally.after,
    }
    (args.out / "soak.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(rows, summary, args.out / "soak.png")
    print(json.dumps(summary, indent=2))


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def plot(rows: list[dict[str, float]], summary: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        # The figures are in the CSV and JSON already; the plot is the `bench` extra's.
        print(f"matplotlib is not installed: no {path.name}")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [row["seconds"] / 60 for row in rows]
    figure, axis = plt.subplots(figsize=(9, 4.5))
    for column, label in (
        ("rss_mb", "server RSS"),
        ("rss_less_cache_mb", "RSS less the prompt cache"),
        ("mx_active_mb", "MLX active"),
        ("mx_cache_mb", "MLX buffer cache"),
        ("prompt_cache_mb", "prompt cache (own count)"),
        ("store_mb", "response store"),
    ):
        axis.plot(minutes, [row[column] for row in rows], label=label)
    axis.set_xlabel("minutes")
    axis.set_ylabel("MB")
    axis.set_ylim(bottom=0)
    axis.set_title(
        f"mlx-relay soak: {summary['clients']} clients, all APIs, {summary['model']} model"
        f" ({sum(summary['requests'].values())} requests)"
    )
    axis.legend(loc="upper left", fontsize="small")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
