"""A Batch API batch beside interactive chat: what it costs the live clients, and what the live load costs it.

    python -m bench.batch_beside_live [--model tiny|demo|PATH] [--lines 500] [--clients 3] [--seconds 8]
                                      [--rounds 3]

One server; each of `--rounds` rounds runs three phases, each batch a fresh one of `--lines` small chat
requests (a few tokens each):

1. live alone: `--clients` clients stream chat for `--seconds`, each request after a short pause;
2. the batch on the idle server, start to `completed`;
3. both at once: the same live load for `--seconds` beside a new batch, then the live load stops and the
   batch runs to its end.

Prints the live TTFT p95 with and without the batch (target: at most 1.2x) and the batch's rate after the
live load stops against its rate on the idle server (target: at least 0.8x), with its whole time in each
case, every figure pooled over the rounds (a shared machine's load drifts from one phase to the next, and
the rounds spread it over both sides); writes bench/out/batch_beside_live.json.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench import report
from bench.load import percentile
from bench.servers import free_port, relay_command, relay_env, started

OUT = Path(__file__).resolve().parent / "out"
DEMOS = frozenset({"demo", "tiny"})
# What a live client waits between its requests: a person reading, so the batch has gaps to fill.
PAUSE = 0.3
# How often the batch's progress is read.
POLL = 0.1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_beside_live", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="demo, tiny (built locally), a model directory or a repo id")
    parser.add_argument("--lines", type=int, default=500, help="requests in each batch (default 500)")
    parser.add_argument("--line-tokens", type=int, default=4, help="max_tokens of each batch request (default 4)")
    parser.add_argument("--clients", type=int, default=3, help="interactive clients (default 3)")
    parser.add_argument("--live-tokens", type=int, default=16, help="max_tokens of each live request (default 16)")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the live load runs (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (default 3)")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


async def _live_request(client: httpx.AsyncClient, index: int, max_tokens: int) -> float | None:
    """One streamed chat; seconds to its first content token, None when it failed."""
    body = {
        "messages": [{"role": "user", "content": f"Question {index}: say something."}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return None
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {") and _has_content(line[6:]):
                first = time.perf_counter() - start
    return first


def _has_content(payload: str) -> bool:
    return any("content" in choice.get("delta", {}) for choice in json.loads(payload).get("choices") or ())


async def live_load(url: str, clients: int, seconds: float, max_tokens: int) -> list[float]:
    """`clients` clients streaming chat, each request after a pause, for `seconds`: every request's TTFT."""
    ttfts: list[float] = []
    deadline = time.perf_counter() + seconds

    async def one_client(number: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            index = number
            while time.perf_counter() < deadline:
                ttft = await _live_request(client, index, max_tokens)
                if ttft is not None:
                    ttfts.append(ttft)
                index += clients
                await asyncio.sleep(PAUSE)

    await asyncio.gather(*(one_client(number) for number in range(clients)))
    return ttfts


async def start_batch(client: httpx.AsyncClient, lines: int, max_tokens: int, tag: str) -> str:
    """Upload `lines` small chat requests as a JSONL file and create a batch of them; its id."""
    jsonl = "".join(
        json.dumps(
            {
                "custom_id": f"{tag}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "messages": [{"role": "user", "content": f"Item {i}: label it."}],
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                },
            }
        )
        + "\n"
        for i in range(lines)
    )
    files = {"file": (f"{tag}.jsonl", io.BytesIO(jsonl.encode()), "application/jsonl")}
    uploaded = await client.post("/v1/files", data={"purpose": "batch"}, files=files)
    uploaded.raise_for_status()
    body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    created = await client.post("/v1/batches", json=body)
    created.raise_for_status()
    return str(created.json()["id"])


async def batch_state(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/batches/{batch_id}")
    response.raise_for_status()
    return dict(response.json())


async def until_ended(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    while (state := await batch_state(client, batch_id))["status"] not in ("completed", "failed", "cancelled"):
        await asyncio.sleep(POLL)
    return state


async def idle_batch(url: str, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        batch_id = await start_batch(client, args.lines, args.line_tokens, "idle")
        state = await until_ended(client, batch_id)
        wall = time.perf_counter() - start
    return {"wall_s": wall, "lines_per_s": args.lines / wall, "counts": state["request_counts"]}


async def batch_beside_live(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """A batch started with the live load; its progress when the load stops, and its rate from then on."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        batch_id = await start_batch(client, args.lines, args.line_tokens, "beside")
        ttfts = await live_load(url, args.clients, args.seconds, args.live_tokens)
        stopped = time.perf_counter()
        done_at_stop = (await batch_state(client, batch_id))["request_counts"]["completed"]
        state = await until_ended(client, batch_id)
        end = time.perf_counter()
    left = args.lines - done_at_stop
    return {
        "ttfts": ttfts,
        "wall_s": end - start,
        "done_beside_live": done_at_stop,
        "lines_per_s_beside_live": done_at_stop / (stopped - start),
        "lines_per_s_after_live": left / (end - stopped) if left else None,
        "lines_after_live": left,
        "seconds_after_live": end - stopped,
        "counts": state["request_counts"],
    }


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every round's phases, pooled: the live TTFTs of each side, and the batch's lines and seconds in each."""
    # A few live requests first, so no phase pays for the first compilations.
    await live_load(url, args.clients, 3.0, args.live_tokens)
    alone: list[float] = []
    idle: list[dict[str, Any]] = []
    beside: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        alone += await live_load(url, args.clients, args.seconds, args.live_tokens)
        idle.append(await idle_batch(url, args))
        beside.append(await batch_beside_live(url, args))
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        stats = (await client.get("/stats")).json()
    return {"alone": alone, "idle": idle, "beside": beside, "gateway": stats.get("gateway", {})}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def pooled(figures: dict[str, Any]) -> dict[str, Any]:
    """The rounds' figures pooled: TTFT percentiles over every live request, rates as lines over seconds."""
    alone, idle, beside = figures["alone"], figures["idle"], figures["beside"]
    ttfts = [ttft for each in beside for ttft in each["ttfts"]]
    idle_rate = len(idle) * idle[0]["counts"]["total"] / sum(each["wall_s"] for each in idle)
    after_lines = sum(each["lines_after_live"] for each in beside)
    after_seconds = sum(each["seconds_after_live"] for each in beside if each["lines_after_live"])
    after_rate = after_lines / after_seconds if after_lines else None
    p95_alone, p95_beside = percentile(alone, 95), percentile(ttfts, 95)
    return {
        "ttft_alone_p50_s": percentile(alone, 50),
        "ttft_alone_p95_s": p95_alone,
        "ttft_beside_p50_s": percentile(ttfts, 50),
        "ttft_beside_p95_s": p95_beside,
        "live_requests": [len(alone), len(ttfts)],
        "idle_wall_s": [each["wall_s"] for each in idle],
        "beside_wall_s": [each["wall_s"] for each in beside],
        "idle_lines_per_s": idle_rate,
        "after_live_lines_per_s": after_rate,
        "beside_live_lines": [each["done_beside_live"] for each in beside],
        "ttft_p95_ratio": p95_beside / p95_alone if p95_alone and p95_beside else None,
        "batch_rate_after_live_ratio": after_rate / idle_rate if after_rate else None,
    }


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    port = free_port()
    env = relay_env(args.model, DEMOS)
    with started("relay-batch-beside-live", relay_command(port), port, env, args.out / "logs") as server:
        figures = asyncio.run(measure(server.url, args))
    summary = pooled(figures)
    header = ("phase", "live requests", "TTFT p50 ms", "TTFT p95 ms", "batch wall s", "batch lines/s")
    walls = {name: "/".join(f"{wall:.1f}" for wall in summary[f"{name}_wall_s"]) for name in ("idle", "beside")}
    after = summary["after_live_lines_per_s"]
    alone_count, beside_count = summary["live_requests"]
    table = [
        ("live alone", str(alone_count), _ms(summary["ttft_alone_p50_s"]), _ms(summary["ttft_alone_p95_s"]), "-", "-"),
        ("batch alone", "0", "-", "-", walls["idle"], f"{summary['idle_lines_per_s']:.1f}"),
        (
            "batch beside live",
            str(beside_count),
            _ms(summary["ttft_beside_p50_s"]),
            _ms(summary["ttft_beside_p95_s"]),
            walls["beside"],
            f"{after or 0:.1f} once the live load stopped",
        ),
    ]
    for each in figures["beside"]:
        del each["ttfts"]
    payload = {"model": args.model, "args": {k: str(v) for k, v in vars(args).items()}, **summary, **figures}
    report.publish(args.out / "batch_beside_live.json", header, table, payload)
    print(f"live TTFT p95 beside the batch / alone: {summary['ttft_p95_ratio'] or float('nan'):.2f}x (target <= 1.2x)")
    ratio = summary["batch_rate_after_live_ratio"]
    print(f"batch rate once the live load stops / idle: {ratio or float('nan'):.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
