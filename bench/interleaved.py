"""Raw mlx-lm, mlx-relay, mlx_lm.server (and llama-server) in alternating waves: ratios, each a median of rounds'.

    python -m bench.interleaved [--model tiny] [--concurrency 1,4,8,16] [--rounds 5] [--max-tokens 64]
                                [--no-llama-server] [--llama-speculate]

`bench.serving` runs its contenders one after another, minutes apart. On a
small shared machine whose load drifts, two of its runs disagree by more
than the gaps it looks for (docs/benchmarks.md, "One run against the
next"). Here all three stay started, raw mlx-lm as a child process that
measures on request (`bench.baselines --serve`). Each round runs one wave
of each, in an order that rotates from round to round, on that round's own
prompts. Every ratio is taken within a round, and the report gives its
median over the rounds (and the range), so drift weighs on them all alike:

- worker / raw: the model worker's CPU per token against `BatchGenerator`'s
  (`stream_generate`'s too at N=1, whose wave runs beside the batch one);
  raw is handed each round's prompts at once, an ideal no server sees;
- worker / raw-as-clients and relay / raw-as-clients: against `BatchGenerator`
  fed as the clients feed the servers (each client's next request the moment
  its last reply ends), so what the arrival shape costs is left out;
- front + worker / mlx_lm.server: the two processes' CPU per token;
- relay / mlx_lm.server and relay / raw: tokens per second;
- relay / ceiling: against what the cores leave a server costing raw's CPU
  per token while the client reads the streams (bench/report.py's ceiling);
- relay / llama-server tok/s and front + worker / llama-server CPU, on a
  built-in model that comes from a GGUF file (smollm2, gemma3): llama.cpp's
  server on that very file (bench/llama_server.py), one slot per client,
  prompt caching on; skipped, saying why, where it does not build.

A built-in model is served by mlx-relay under its name; raw mlx-lm and
mlx_lm.server get a float32 copy of its directory, the form mlx-relay serves
on a Linux CPU (bench/servers.py `float32_copy`).

Writes interleaved.json under --out. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench import report
from bench.baselines import MARK
from bench.cpu import tree_cpu_seconds, tree_cpu_split
from bench.llama_server import add_arguments as add_llama_arguments
from bench.llama_server import llama_contender, llama_env
from bench.load import run_wave, summarize, warm_up
from bench.servers import REPO, Server, float32_copy, free_port, mlx_lm_command, relay_command, relay_env, started
from bench.workload import WARMUP_PROMPT, Workload
from stages.models.builtin import BUILTIN_MODELS, builtin_model_path
from stages.models.demo import DEMO_MODELS

OUT = Path(__file__).resolve().parent / "out"
Figures = dict[str, float]
# What one round gives each ratio: (name, from the round's figures).
RATIOS: dict[str, Callable[[dict[str, Figures]], float | None]] = {
    "worker / raw CPU": lambda r: r["relay"]["worker_cpu"] / r["raw"]["cpu"],
    "worker / stream_generate CPU": lambda r: r["relay"]["worker_cpu"] / r["stream"]["cpu"] if "stream" in r else None,
    "worker / raw-as-clients CPU": lambda r: r["relay"]["worker_cpu"] / r["clients"]["cpu"] if "clients" in r else None,
    "relay / raw-as-clients tok/s": lambda r: r["relay"]["tok_s"] / r["clients"]["tok_s"] if "clients" in r else None,
    "front+worker / mlx_lm.server CPU": lambda r: r["relay"]["cpu"] / r["mlx_lm"]["cpu"],
    "relay / mlx_lm.server tok/s": lambda r: r["relay"]["tok_s"] / r["mlx_lm"]["tok_s"],
    "relay / raw tok/s": lambda r: r["relay"]["tok_s"] / r["raw"]["tok_s"],
    "relay / ceiling": lambda r: r["relay"]["tok_s"] / r["raw"]["ceiling"],
    "front+worker / llama-server CPU": lambda r: r["relay"]["cpu"] / r["llama"]["cpu"] if "llama" in r else None,
    "relay / llama-server tok/s": lambda r: r["relay"]["tok_s"] / r["llama"]["tok_s"] if "llama" in r else None,
}
CONTENDERS = ("raw", "clients", "stream", "relay", "mlx_lm", "llama")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.interleaved", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="tiny", help="a built-in name (demo, tiny, smollm2...), a directory or repo id"
    )
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    add_llama_arguments(parser)
    args = parser.parse_args(argv)
    path = _model_path(args.model, args.out)
    levels = [int(level) for level in args.concurrency.split(",")]
    workload = Workload(
        concurrency=tuple(levels), max_tokens=args.max_tokens, requests_per_client=args.requests_per_client
    )
    rounds: dict[int, list[dict[str, Figures]]] = {level: [] for level in levels}
    with ExitStack() as stack:
        raw = stack.enter_context(_raw_child(path, workload))
        relay_port, peer_port = free_port(), free_port()
        relay_environment = relay_env(args.model if args.model in BUILTIN_MODELS else path, frozenset(DEMO_MODELS))
        logs = args.out / "logs"
        relay = stack.enter_context(started("relay", relay_command(relay_port), relay_port, relay_environment, logs))
        peer = stack.enter_context(started("mlx_lm", mlx_lm_command(path, peer_port), peer_port, os.environ, logs))
        servers = {"relay": relay, "mlx_lm": peer}
        if args.llama_server and (llama := _llama(stack, args, max(levels), logs)) is not None:
            servers["llama"] = llama
        for server in servers.values():
            asyncio.run(warm_up(server.url, WARMUP_PROMPT, args.max_tokens))
        contenders: dict[str, Callable[[int, int], Figures]] = {
            "raw": lambda level, wave: raw("batch", level, wave),
            "clients": lambda level, wave: raw("clients", level, wave),
        }
        for name, server in servers.items():
            contenders[name] = partial(server_wave, server, workload=workload, split=name == "relay")
        names = list(contenders)
        for index in range(args.rounds):
            for level in levels:
                # Each round its own prompts (a wave index past any warm-up's), its own order of turns.
                wave = 1 + index
                order = names[index % len(names) :] + names[: index % len(names)]
                figures = {name: contenders[name](level, wave) for name in order}
                if level == 1:
                    figures["stream"] = raw("stream", level, wave)
                cores = os.cpu_count() or 1
                client = figures["relay"]["client_cpu"]
                figures["raw"]["ceiling"] = report.ceiling(
                    figures["raw"]["tok_s"], figures["raw"]["cpu"], client, cores
                )
                rounds[level].append(figures)
                print(f"round {index + 1} N={level}: " + _line(figures), flush=True)
    summaries = {str(level): _summary(per_round) for level, per_round in rounds.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "interleaved.json").write_text(json.dumps({"model": args.model, "levels": summaries}, indent=2))
    _print(summaries, args.rounds)


def _model_path(model: str, out: Path) -> str:
    """The directory raw mlx-lm and mlx_lm.server load: a built-in's float32 copy, or `model` itself."""
    built = builtin_model_path(model)
    if built is None:
        return model
    if model in DEMO_MODELS:
        return str(built)
    return str(float32_copy(built, out / "float32"))


def _llama(stack: ExitStack, args: argparse.Namespace, slots: int, logs: Path) -> Server | None:
    """llama-server on the model's GGUF file, a slot per client, started for the life of `stack`; None if skipped."""
    port = free_port()
    # A slot holds one prompt and its answer: the workload's prompts are a few dozen tokens.
    command = llama_contender(args.model, port, parallel=slots, slot_context=512, speculate=args.llama_speculate)
    return None if command is None else stack.enter_context(started("llama", command, port, llama_env(), logs))


def server_wave(server: Server, level: int, wave: int, *, workload: Workload, split: bool) -> Figures:
    assert server.process is not None  # started here
    pid = server.process.pid
    before_tree, before_split = tree_cpu_seconds(pid), tree_cpu_split(pid)
    measured = asyncio.run(run_wave(server.url, level, workload, wave=wave))
    after_tree, after_split = tree_cpu_seconds(pid), tree_cpu_split(pid)
    summary = summarize(measured, workload.max_tokens)
    tokens = int(summary["completion_tokens"])  # type: ignore[call-overload]  # summarize's values are objects
    if summary["errors"] or not tokens or None in (before_tree, after_tree, before_split, after_split):
        raise SystemExit(f"{server.name}: a wave failed or /proc is missing: {summary['errors']}")
    assert before_tree is not None and after_tree is not None and before_split and after_split  # checked above
    per_1k = 1000 / tokens
    figures = {
        "tok_s": float(summary["tokens_per_s"]),  # type: ignore[arg-type]
        "cpu": (after_tree - before_tree) * per_1k,
        "client_cpu": measured.client_cpu * per_1k,
    }
    if split:
        figures["front_cpu"] = (after_split[0] - before_split[0]) * per_1k
        figures["worker_cpu"] = (after_split[1] - before_split[1]) * per_1k
    return figures


@contextmanager
def _raw_child(path: str, workload: Workload) -> Iterator[Callable[[str, int, int], Figures]]:
    """Raw mlx-lm kept in a child of its own (its MLX never shares a process with a server), measuring on request."""
    command = [sys.executable, "-m", "bench.baselines", "--serve", "--model", path]
    command += ["--max-tokens", str(workload.max_tokens), "--requests-per-client", str(workload.requests_per_client)]
    with subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdin is not None and child.stdout is not None  # PIPE

        def measure(kind: str, level: int, wave: int) -> Figures:
            assert child.stdin is not None and child.stdout is not None  # PIPE
            child.stdin.write(json.dumps({"kind": kind, "level": level, "wave": wave}) + "\n")
            child.stdin.flush()
            for line in child.stdout:
                if line.startswith(MARK) and (record := json.loads(line.removeprefix(MARK)))["kind"] == kind:
                    return {"tok_s": record["tokens_per_s"], "cpu": record["cpu_s_per_1k_tokens"]}
            raise SystemExit(f"raw mlx-lm exited with {child.wait()}")

        try:
            yield measure
        finally:
            child.stdin.close()


def _line(figures: dict[str, Figures]) -> str:
    return "  ".join(f"{name} {f['tok_s']:.0f} tok/s {f['cpu']:.3f} s/1k" for name, f in figures.items())


def _summary(per_round: list[dict[str, Figures]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, ratio in RATIOS.items():
        values = [value for figures in per_round if (value := ratio(figures)) is not None]
        if values:
            summary[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    for contender in CONTENDERS:
        rounds = [figures[contender] for figures in per_round if contender in figures]
        if rounds:
            summary[contender] = {key: statistics.median(f[key] for f in rounds) for key in rounds[0]}
    return summary


def _print(report: dict[str, dict[str, Any]], rounds: int) -> None:
    print(f"\nMedian of {rounds} rounds (min-max), each ratio taken within its round:\n")
    print("| N | " + " | ".join(RATIOS) + " |")
    print("| ---: |" + " ---: |" * len(RATIOS))
    for level, summary in report.items():
        cells = [
            f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})" if (s := summary.get(name)) else "-"
            for name in RATIOS
        ]
        print(f"| {level} | " + " | ".join(cells) + " |")
    print("\n| N | contender | tok/s | CPU s/1k tok | front | worker | client |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for level, summary in report.items():
        for contender in CONTENDERS:
            if (f := summary.get(contender)) is not None:
                parts = [f"{f[key]:.3f}" if key in f else "-" for key in ("front_cpu", "worker_cpu", "client_cpu")]
                print(f"| {level} | {contender} | {f['tok_s']:.0f} | {f['cpu']:.3f} | " + " | ".join(parts) + " |")


if __name__ == "__main__":
    main()
