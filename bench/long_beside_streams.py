"""A long prompt arriving while streams decode: its TTFT and the streams' inter-token gaps, each against idle.

    python -m bench.long_beside_streams [--model smollm2|gemma3] [--prompt-tokens 4096] [--streams 8]
                                        [--rounds 3] [--contenders relay,relay-fixed,mlx_lm]

Issue #37's workload. Every contender stays started; each round runs each
of them once, in an order that rotates from round to round, and each turn
has two phases:

1. idle: the long prompt alone (`/v1/completions`, one token): its TTFT;
2. beside: `--streams` chat streams decode; once each has given a few
   tokens, their gaps over the next `--idle-tokens` tokens are the idle
   gaps, then a long prompt arrives: its TTFT, and the streams' gaps while
   it prefills (the gaps that end between its send and its answer).

Each prompt is new (its first word differs), so no prompt cache helps.
Every ratio is taken within one turn (beside over idle), and the report
gives its median over the rounds, with the load average at each round's
start: the machine is shared, and its load moves between turns.

Contenders: `relay` (mlx-relay as configured by default: the step aims at
twice the decode-only step, at least 200 ms), `relay-fixed` (a fixed
`--budget-ms` target, `MLX_RELAY_STEP_BUDGET_MS` set: the behaviour before
the ratio), `relay-512` (no time target: every chunk 512 tokens), and
`mlx_lm` (mlx_lm.server on the same float32 weights, its defaults:
2,048-token prefill chunks); `--tree NAME=DIR` adds mlx-relay from another
checkout, as `relay` runs, to weigh a change within the same rounds. Targets (issue #37): streams' gap p95 beside
<= 2x idle, the prompt's TTFT beside <= 1.2x idle. On a compute-bound
machine they cannot both hold (docs/step-budget.md, "Sized to the decode
step"); `1/TTFT ratio + 1/gap ratio` (gap medians) is what the machine
kept of its work while interleaving, 1 at best. Writes
long_beside_streams-MODEL.json under --out.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench import report
from bench.load import percentile
from bench.servers import REPO, Server, float32_copy, free_port, mlx_lm_command, relay_command, relay_env, started
from stages.models.builtin import builtin_model_path
from stages.models.demo import DEMO_MODELS

OUT = Path(__file__).resolve().parent / "out"
# Tokens each stream gives before any gap counts: the first ones come while the others still prefill.
LEAD_TOKENS = 4
# A budget no step reaches: every chunk is prefill_step_size tokens.
UNBOUNDED_MS = "1000000000"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.long_beside_streams", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a built-in name (smollm2, gemma3...) or a directory")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--idle-tokens", type=int, default=8, help="tokens a stream gives for its idle gaps")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default="relay,relay-fixed,mlx_lm")
    parser.add_argument("--budget-ms", default="200", help="relay-fixed's MLX_RELAY_STEP_BUDGET_MS")
    parser.add_argument(
        "--tree", action="append", default=[], help="NAME=DIR: a contender that is mlx-relay from another checkout"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def _model_path(model: str, out: Path) -> Path:
    """The directory mlx_lm.server loads: a built-in's float32 copy (what mlx-relay serves on a Linux CPU)."""
    built = builtin_model_path(model)
    if built is None:
        return Path(model)
    return built if model in DEMO_MODELS else float32_copy(built, out / "float32")


def _relay_env(model: str, name: str, budget_ms: str) -> dict[str, str]:
    env = relay_env(model, frozenset(DEMO_MODELS))
    env.pop("MLX_RELAY_STEP_BUDGET_MS", None)
    env.pop("MLX_RELAY_STEP_BUDGET_RATIO", None)
    # On a machine loaded past its cores a step can outlast the default heartbeat, and the worker would be
    # restarted under the bench; the bench measures steps, not the supervisor.
    env.setdefault("MLX_RELAY_WORKER_HEARTBEAT_TIMEOUT", "60")
    if name == "relay-fixed":
        env["MLX_RELAY_STEP_BUDGET_MS"] = budget_ms
    elif name == "relay-512":
        env["MLX_RELAY_STEP_BUDGET_MS"] = UNBOUNDED_MS
    return env


class Prompts:
    """Prompts of about `tokens` tokens, each new: a different first word, then numbered sentences."""

    def __init__(self, path: Path, tokens: int) -> None:
        from mlx_lm.utils import load_tokenizer

        self.tokenizer = load_tokenizer(path)
        self.eos_ids = sorted(self.tokenizer.eos_token_ids)
        rng = random.Random(0)
        text = " ".join(f"Item {rng.randrange(10_000)} weighs {rng.randrange(1_000)} grams." for _ in range(tokens))
        ids = self.tokenizer.encode(text)[:tokens]
        self.body = self.tokenizer.decode(ids)
        self.made = 0

    def next(self) -> str:
        self.made += 1
        return f"Ledger{self.made} {self.body}"


def _stream(server: Server, index: int, arrivals: list[float], stop: threading.Event, eos_ids: list[int]) -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": f"Tell me a long story about the number {index}."}],
        "max_tokens": 4000,
        "temperature": 0.0,
        "stream": True,
    }
    # mlx-relay's own switch; mlx_lm.server has none, and a bias keeps EOS from being sampled.
    if server.name.startswith("relay"):
        body["ignore_eos"] = True
    else:
        body["logit_bias"] = {str(eos): -100 for eos in eos_ids}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if stop.is_set():
                return
            if line.startswith("data: {") and '"content"' in line:
                arrivals.append(time.perf_counter())


def _ttft(server: Server, prompt: str) -> float:
    """Seconds to a one-token completion of `prompt`: its prefill and one step."""
    began = time.perf_counter()
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    httpx.post(f"{server.url}/v1/completions", json=body, timeout=3600).raise_for_status()
    return time.perf_counter() - began


def _chunks(server: Server, seen: list[int], stop: threading.Event) -> None:
    # mlx-relay's last chosen prefill chunk, read while the prompt prefills.
    while not stop.wait(0.5):
        stats = httpx.get(f"{server.url}/stats", timeout=10).json()
        seen.append(int(stats.get("gateway", {}).get("prefill_chunk", 0)))


def _gaps(arrivals: list[list[float]], start: float, end: float) -> list[float]:
    return [b - a for times in arrivals for a, b in itertools.pairwise(times) if start < b <= end]


def turn(server: Server, prompts: Prompts, streams: int, idle_tokens: int) -> dict[str, Any]:
    """One contender's turn: the prompt alone, then the streams alone and a prompt beside them."""
    idle_ttft = _ttft(server, prompts.next())
    arrivals: list[list[float]] = [[] for _ in range(streams)]
    stop = threading.Event()
    args = [(server, i, arrivals[i], stop, prompts.eos_ids) for i in range(streams)]
    threads = [threading.Thread(target=_stream, args=each) for each in args]
    chunks: list[int] = []
    poller = None
    for thread in threads:
        thread.start()
    try:
        while min(map(len, arrivals)) < LEAD_TOKENS:
            time.sleep(0.01)
        lead = time.perf_counter()
        while min(map(len, arrivals)) < LEAD_TOKENS + idle_tokens:
            time.sleep(0.01)
        prompt = prompts.next()
        poller = (
            threading.Thread(target=_chunks, args=(server, chunks, stop))
            if not server.name.startswith("mlx_lm")
            else None
        )
        if poller is not None:
            poller.start()
        sent = time.perf_counter()
        beside_ttft = _ttft(server, prompt)
        answered = sent + beside_ttft
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        if poller is not None:
            poller.join()
    idle, beside = _gaps(arrivals, lead, sent), _gaps(arrivals, sent, answered)
    # Let the closed streams leave the batch (mlx_lm.server sees a closed stream at its next token).
    time.sleep(3.0)
    figures = {
        "idle_ttft_s": idle_ttft,
        "beside_ttft_s": beside_ttft,
        "idle_gap_p50_s": percentile(idle, 50),
        "idle_gap_p95_s": percentile(idle, 95),
        "beside_gap_p50_s": percentile(beside, 50),
        "beside_gap_p95_s": percentile(beside, 95),
        "beside_gap_max_s": max(beside, default=None),
        "idle_gap_mean_s": statistics.fmean(idle) if idle else None,
        "beside_gap_mean_s": statistics.fmean(beside) if beside else None,
        "gaps": [len(idle), len(beside)],
        "chunks": sorted({c for c in chunks if c}),
    }
    return figures | ratios(figures)


def ratios(figures: dict[str, Any]) -> dict[str, float | None]:
    """Beside over idle, within one turn.

    `kept` is 1/(TTFT ratio) + 1/(mean gap ratio): the share of the machine the prompt had (its idle time over
    its time beside) plus the streams' share (their idle rate over their rate beside). On a machine that runs
    one pass at a time it is 1 when interleaving costs nothing, less for what small chunks and extra steps
    cost; the two targets together need 1/1.2 + 1/2 = 1.33.
    """

    def ratio(key: str) -> float | None:
        idle, beside = figures[f"idle_{key}"], figures[f"beside_{key}"]
        return beside / idle if idle and beside else None

    ttft, mean = ratio("ttft_s"), ratio("gap_mean_s")
    kept = 1 / ttft + 1 / mean if ttft and mean else None
    return {
        "ttft_ratio": ttft,
        "gap_p50_ratio": ratio("gap_p50_s"),
        "gap_p95_ratio": ratio("gap_p95_s"),
        "gap_mean_ratio": mean,
        "kept": kept,
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    trees = dict(text.split("=", 1) for text in args.tree)
    names = args.contenders.split(",") + list(trees)
    path = _model_path(args.model, args.out)
    prompts = Prompts(path, args.prompt_tokens)
    logs = args.out / "logs"
    per_round: list[dict[str, Any]] = []
    with ExitStack() as stack:
        servers: dict[str, Server] = {}
        for name in names:
            port = free_port()
            if name == "mlx_lm":
                command, env = mlx_lm_command(str(path), port), dict(os.environ)
            else:
                command, env = relay_command(port), _relay_env(args.model, name, args.budget_ms)
            tree = Path(trees[name]) if name in trees else REPO
            servers[name] = stack.enter_context(started(f"{name}-{args.model}", command, port, env, logs, cwd=tree))
        for server in servers.values():  # warm-up: the first compilations, and a short prefill
            _ttft(server, prompts.next()[:200])
        for index in range(args.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            load = os.getloadavg()[0]
            figures = {name: turn(servers[name], prompts, args.streams, args.idle_tokens) for name in order}
            per_round.append({"load_average": load, **figures})
            print(f"round {index + 1} (load {load:.1f}): " + _line(figures), flush=True)
            # Each round as it ends: on a loaded machine a run can outlast the time there is for it.
            report.write_json(args.out / f"long_beside_streams-{args.model}-rounds.json", {"rounds": per_round})
    summary = {name: {key: _median([r[name][key] for r in per_round]) for key in _KEYS} for name in names}
    header = ("contender", "TTFT idle s", "TTFT beside s", "TTFT x", "gap p50 idle/beside ms", "gap p95 idle/beside ms")
    table = [_row(name, summary[name]) for name in names]
    payload = {"model": args.model, "args": {k: str(v) for k, v in vars(args).items()}, "summary": summary}
    report.publish(args.out / f"long_beside_streams-{args.model}.json", header, table, payload | {"rounds": per_round})
    for name in names:
        s = summary[name]
        print(
            f"{name}: gap p95 x{_x(s['gap_p95_ratio'])} (target <= 2), TTFT x{_x(s['ttft_ratio'])} (target <= 1.2), "
            f"kept {_x(s['kept'])} (medians of {args.rounds} rounds)"
        )


_KEYS = (
    *("idle_ttft_s", "beside_ttft_s", "idle_gap_p50_s", "idle_gap_p95_s", "beside_gap_p50_s", "beside_gap_p95_s"),
    *("idle_gap_mean_s", "beside_gap_mean_s", "ttft_ratio", "gap_p50_ratio", "gap_p95_ratio", "gap_mean_ratio"),
    "kept",
)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _row(name: str, s: dict[str, Any]) -> tuple[str, ...]:
    return (
        name,
        _x(s["idle_ttft_s"]),
        _x(s["beside_ttft_s"]),
        _x(s["ttft_ratio"]),
        f"{_ms(s['idle_gap_p50_s'])} / {_ms(s['beside_gap_p50_s'])}",
        f"{_ms(s['idle_gap_p95_s'])} / {_ms(s['beside_gap_p95_s'])}",
    )


def _line(figures: dict[str, dict[str, Any]]) -> str:
    return "; ".join(
        f"{name} TTFT {f['idle_ttft_s']:.1f}->{f['beside_ttft_s']:.1f} s, gap p95 {_ms(f['idle_gap_p95_s'])}->"
        f"{_ms(f['beside_gap_p95_s'])} ms, chunks {f['chunks'][:3]}{'...' if len(f['chunks']) > 3 else ''}"
        for name, f in figures.items()
    )


if __name__ == "__main__":
    main()
