"""A model loading beside another model's streams: the streams' inter-token gaps, alone and during the load.

    python -m bench.fleet [--streaming demo] [--loading smollm2] [--streams 4] [--rounds 4]

One server serves both models (MLX_RELAY_MODEL=<streaming>,<loading>).
Each round runs `--streams` streaming chats on the streaming model twice:
once alone, once while the other model is loaded (`POST
/admin/models/<name>/load`, a moment after the streams start) and then
unloaded again after the round. The figure is the p95 gap between a
stream's chunks that arrive while the load runs, against the p95 of the
rounds alone (target: at most +20%); rounds alternate, so a machine whose
load drifts weighs on both sides alike. Writes bench/out/fleet-fork-auto.json (or -off).
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.load import chunk_arrivals, percentile
from bench.servers import free_port, relay_command, started

OUT = Path(__file__).resolve().parent / "out"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--streaming", default="demo", help="the model that streams (a built-in, a directory or a repo id)"
    )
    parser.add_argument("--loading", default="smollm2", help="the model loaded meanwhile")
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per stream")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each alone then with a load")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds after the streams start before the load")
    parser.add_argument(
        "--fork", choices=("auto", "off"), default="auto", help="MLX_RELAY_WORKER_FORK: workers forked or spawned"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def _gaps(arrivals: list[float], window: tuple[float, float] | None = None) -> list[float]:
    # The first gap is the prompt's prefill, not a decode step; a window keeps gaps that end inside it.
    pairs = itertools.pairwise(arrivals[1:])
    return [later - earlier for earlier, later in pairs if window is None or window[0] <= later <= window[1]]


def _round(url: str, args: argparse.Namespace, *, load: bool) -> tuple[list[list[float]], tuple[float, float] | None]:
    window: list[float] = []

    def loader() -> None:
        time.sleep(args.delay)
        window.append(time.perf_counter())
        httpx.post(f"{url}/admin/models/{args.loading}/load", json={}, timeout=600).raise_for_status()
        window.append(time.perf_counter())

    thread = threading.Thread(target=loader) if load else None
    with ThreadPoolExecutor(args.streams) as pool:
        futures = [
            pool.submit(chunk_arrivals, url, args.streaming, i, args.max_tokens, {"seed": i})
            for i in range(args.streams)
        ]
        if thread is not None:
            thread.start()
        streams = [future.result() for future in futures]
    if thread is not None:
        thread.join()
        httpx.post(f"{url}/admin/models/{args.loading}/unload", json={}, timeout=600).raise_for_status()
    return streams, (window[0], window[1]) if load else None


def _quantiles(gaps: list[float]) -> dict[str, float]:
    return {f"p{q}": round((percentile(gaps, q) or 0.0) * 1000, 2) for q in (50, 95, 99)} | {"n": len(gaps)}


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    port = free_port()
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MLX_RELAY_")}
    env["MLX_RELAY_MODEL"] = f"{args.streaming},{args.loading}"
    env["MLX_RELAY_WORKER_FORK"] = args.fork
    alone: list[float] = []
    during: list[float] = []
    whole: list[float] = []
    load_seconds: list[float] = []
    with started("relay-fleet", relay_command(port), port, env, args.out / "logs") as server:
        _round(server.url, argparse.Namespace(**{**vars(args), "streams": 1, "max_tokens": 16}), load=False)  # warm-up
        for _ in range(args.rounds):
            streams, _none = _round(server.url, args, load=False)
            alone += [gap for arrivals in streams for gap in _gaps(arrivals)]
            streams, window = _round(server.url, args, load=True)
            assert window is not None
            load_seconds.append(window[1] - window[0])
            during += [gap for arrivals in streams for gap in _gaps(arrivals, window)]
            whole += [gap for arrivals in streams for gap in _gaps(arrivals)]
            if any(arrivals[-1] < window[1] for arrivals in streams):
                print("note: a stream ended before the load did; raise --max-tokens to cover the whole load")
    result: dict[str, Any] = {
        "streaming": args.streaming,
        "loading": args.loading,
        "streams": args.streams,
        "rounds": args.rounds,
        "fork": args.fork,
        "gaps_alone_ms": _quantiles(alone),
        "gaps_during_load_ms": _quantiles(during),
        "gaps_loaded_rounds_ms": _quantiles(whole),
        "load_seconds": [round(seconds, 3) for seconds in load_seconds],
    }
    rise = result["gaps_during_load_ms"]["p95"] / result["gaps_alone_ms"]["p95"] - 1
    result["p95_rise_during_load"] = round(rise, 3)
    print(
        f"{args.streams} streams on {args.streaming}, p50 / p95 / p99 gap (ms): alone "
        + " / ".join(str(v) for k, v in result["gaps_alone_ms"].items() if k != "n")
        + f"; while {args.loading} loads (median {sorted(load_seconds)[len(load_seconds) // 2]:.2f} s) "
        + " / ".join(str(v) for k, v in result["gaps_during_load_ms"].items() if k != "n")
        + f" (p95 {rise:+.0%}; target at most +20%)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"fleet-fork-{args.fork}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
