"""Embeddings: inputs/s by batch size, and the decode stall they cause to running streams.

    python -m bench.embeddings [--model demo|tiny|PATH] [--embedding-model MODEL] [--seconds 10] [--streams 4]

Throughput: one client posts /v1/embeddings with 1, 16 and 64 inputs of
about `--input-words` words each, back to back, for `--seconds` per size.
With `--embedding-model` (e.g. `shaped:qwen3-embedding-0.6b-2l`) the
embeddings come from that dedicated model, served beside the chat model
(requests name no model, which picks it).
Stall: `--streams` streaming chat requests run alone, then again while a
client keeps a steady embedding load (batches of 16, back to back); the
p95 gap between a stream's chunks is compared (target: at most 20% more).
Writes bench/out/embeddings.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.load import percentile
from bench.servers import free_port, relay_command, relay_env, started

OUT = Path(__file__).resolve().parent / "out"
DEMOS = frozenset({"demo", "tiny"})
BATCHES = (1, 16, 64)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny (built locally), a model directory or a repo id")
    parser.add_argument(
        "--embedding-model", default=None, help="a dedicated embedding model (MLX_RELAY_EMBEDDING_MODEL)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per batch size")
    parser.add_argument("--input-words", type=int, default=24, help="words per embedding input")
    parser.add_argument("--streams", type=int, default=4, help="concurrent chat streams in the stall test")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per chat stream")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds alone and under load")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="an extra server setting")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def _body(count: int, words: int, salt: int = 0) -> dict[str, Any]:
    # base64, as the openai SDK asks by default.
    return {"input": _inputs(count, words, salt), "encoding_format": "base64"}


def _inputs(count: int, words: int, salt: int = 0) -> list[str]:
    return [" ".join(f"word{(salt + i * 7 + j) % 97}" for j in range(words)) for i in range(count)]


def _throughput(url: str, batch: int, seconds: float, words: int) -> float:
    with httpx.Client(timeout=300) as client:
        client.post(f"{url}/v1/embeddings", json=_body(batch, words)).raise_for_status()
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            client.post(f"{url}/v1/embeddings", json=_body(batch, words, done)).raise_for_status()
            done += batch
        return done / (time.perf_counter() - start)


def _stream_gaps(url: str, index: int, max_tokens: int) -> list[float]:
    body = {
        "messages": [{"role": "user", "content": f"Tell me about {index}."}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": index,
        "stream": True,
    }
    arrivals: list[float] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                arrivals.append(time.perf_counter())
    # The first gap is the prompt's prefill, not a decode step.
    return [later - earlier for earlier, later in itertools.pairwise(arrivals[1:])]


def _gaps(url: str, streams: int, max_tokens: int) -> list[float]:
    with ThreadPoolExecutor(streams) as pool:
        return [gap for gaps in pool.map(lambda i: _stream_gaps(url, i, max_tokens), range(streams)) for gap in gaps]


def _quantiles(gaps: list[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(gaps, q) or 0.0, 6) for q in (50, 95, 99)} | {"max": round(max(gaps), 6)}


def _step_gaps(url: str) -> dict[str, int]:
    return dict(httpx.get(f"{url}/stats", timeout=10).json()["exclusive"]["step_gaps"])


def _histogram_quantiles(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """p50/p95/p99 of the model thread's step gaps (ms) between two snapshots, interpolated in their bucket."""
    bounds = [float(key.removeprefix("le_")) for key in after]
    counts = [after[key] - before.get(key, 0) for key in after]
    total, result = sum(counts), {}
    for q in (50, 95, 99):
        target, seen, low = total * q / 100, 0, 0.0
        for bound, count in zip(bounds, counts):
            if count and seen + count >= target:
                high = bound if bound != float("inf") else low * 2
                result[f"p{q}"] = round(low + (high - low) * (target - seen) / count, 2)
                break
            seen, low = seen + count, bound
    return result


def _under_load(url: str, args: argparse.Namespace) -> tuple[list[float], float]:
    """Gaps with a steady embedding load beside the streams, and the load's inputs/s meanwhile.

    The load runs in a process of its own: as a thread here it would share
    this interpreter's lock with the stream readers and lengthen the gaps
    they measure by its own Python, which is not the server's doing.
    """
    context = multiprocessing.get_context("spawn")
    stop, done = context.Event(), context.Value("q", 0)
    loader = context.Process(target=_embedding_load, args=(url, args.input_words, stop, done))
    loader.start()
    try:
        while done.value == 0 and loader.is_alive():
            time.sleep(0.01)  # the load is running before the streams start
        start, before = time.perf_counter(), done.value
        gaps = _gaps(url, args.streams, args.max_tokens)
        rate = (done.value - before) / (time.perf_counter() - start)
    finally:
        stop.set()
        loader.join()
    if loader.exitcode != 0:
        raise RuntimeError(f"the embedding load failed (exit code {loader.exitcode}); its traceback is above")
    return gaps, rate


def _embedding_load(url: str, words: int, stop: Any, done: Any) -> None:
    """Batches of 16 back to back until `stop` is set (in the load's own process)."""
    with httpx.Client(timeout=300) as client:
        while not stop.is_set():
            client.post(f"{url}/v1/embeddings", json=_body(16, words, done.value)).raise_for_status()
            with done.get_lock():
                done.value += 16


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    port = free_port()
    env = relay_env(args.model, DEMOS) | dict(item.split("=", 1) for item in args.env)
    if args.embedding_model:
        env["MLX_RELAY_EMBEDDING_MODEL"] = args.embedding_model
    result: dict[str, Any] = {
        "model": args.model,
        "embedding_model": args.embedding_model,
        "input_words": args.input_words,
        "env": args.env,
    }
    with started("relay-embeddings", relay_command(port), port, env, args.out / "logs") as server:
        result["inputs_per_s"] = {
            str(b): round(_throughput(server.url, b, args.seconds, args.input_words), 1) for b in BATCHES
        }
        _gaps(server.url, 1, 16)  # warm-up
        # Rounds alternate, so a machine whose load drifts weighs on both sides alike.
        alone_gaps: list[float] = []
        loaded_gaps: list[float] = []
        rates = []
        steps = {"alone": [_step_gaps(server.url)] * 2, "loaded": [_step_gaps(server.url)] * 2}
        for _ in range(args.rounds):
            before = _step_gaps(server.url)
            alone_gaps += _gaps(server.url, args.streams, args.max_tokens)
            middle = _step_gaps(server.url)
            gaps, rate = _under_load(server.url, args)
            after = _step_gaps(server.url)
            loaded_gaps += gaps
            rates.append(rate)
            for phase, (start, end) in (("alone", (before, middle)), ("loaded", (middle, after))):
                first, last = steps[phase]
                steps[phase] = [first, {k: last[k] + end[k] - start[k] for k in end}]
        exclusive = httpx.get(f"{server.url}/stats", timeout=10).json()["exclusive"]
    model_alone = _histogram_quantiles(*steps["alone"])
    model_loaded = _histogram_quantiles(*steps["loaded"])
    model_rise = model_loaded["p95"] / model_alone["p95"] - 1
    result |= {
        "model_step_gaps_alone_ms": model_alone,
        "model_step_gaps_loaded_ms": model_loaded,
        "model_p95_rise": model_rise,
    }
    alone, loaded = _quantiles(alone_gaps), _quantiles(loaded_gaps)
    rise = loaded["p95"] / alone["p95"] - 1
    rate = sum(rates) / len(rates)
    result |= {
        "gaps_alone_s": alone,
        "gaps_loaded_s": loaded,
        "p95_rise": rise,
        "load_inputs_per_s": rate,
        "exclusive": exclusive,
    }
    print(
        f"model thread's step gaps, ms (p50 / p95 / p99): alone {' / '.join(map(str, model_alone.values()))}; "
        f"under load {' / '.join(map(str, model_loaded.values()))} (p95 {model_rise:+.0%}; target at most +20%)"
    )
    print("inputs/s by batch: " + ", ".join(f"{b}: {v}" for b, v in result["inputs_per_s"].items()))
    print(
        f"inter-token gaps of {args.streams} streams, ms (p50 / p95 / p99 / max): alone "
        + " / ".join(f"{v * 1000:.1f}" for v in alone.values())
        + f"; under {rate:.0f} embedded inputs/s "
        + " / ".join(f"{v * 1000:.1f}" for v in loaded.values())
        + f" (p95 {rise:+.0%}, as clients see it)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "embeddings.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
