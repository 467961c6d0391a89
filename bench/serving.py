"""Serving benchmark: mlx-relay against raw mlx-lm and mlx_lm.server.

    python -m bench.serving [--model demo|tiny|PATH] [--concurrency 1,4,8,16] [--max-tokens 64] [--waves 3]

For each concurrency level N, N streaming clients send distinct prompts to
`/v1/completions` at temperature 0, to mlx-relay and then to mlx_lm.server,
each started here on the same model and BLAS (or `--url` for a running
mlx-relay). Raw mlx-lm runs the same prompts through `BatchGenerator` at
batch size N, and `stream_generate` for N = 1. The phases run one after
another, never side by side: on a small CPU machine, two contenders at once
would measure each other. With `--waves W` each level runs W waves (new
prompts each time) and reports the median wave by throughput. Besides
speed it reports each server's CPU seconds per 1,000 generated tokens
(its process tree, from /proc) and, for mlx-relay, the model thread's
share of the wave spent waiting for the event loop (`/stats`). Writes bench/out/serving.{json,png}, and server
logs to bench/out/logs/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs in the venv

from bench import report
from bench.baselines import Record, run_raw
from bench.cpu import tree_cpu_seconds, tree_cpu_split
from bench.load import run_wave, summarize, warm_up
from bench.process_cpu import print_process_cpu
from bench.servers import Server, free_port, mlx_lm_command, relay_command, relay_env, started, wait_healthy
from bench.workload import WARMUP_PROMPT, Workload

OUT = Path(__file__).resolve().parent / "out"
PEERS = ("raw", "mlx_lm")
# mlx-relay as started for each variant: hypercorn's extra arguments, and settings.
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "asyncio": ([], {}),
    "uvloop": (["--worker-class", "uvloop"], {}),
    "batch-only": ([], {"MLX_RELAY_SINGLE_ROW": "0"}),
    # The model in the HTTP process, as before model workers (stages/remote/).
    "in-process": ([], {"MLX_RELAY_IN_PROCESS": "1"}),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny (built locally), a model directory or a repo id")
    parser.add_argument("--concurrency", default="1,4,8,16", help="comma-separated client counts (default 1,4,8,16)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    # Two, not one: a wave of one request per client lasts under a second with the
    # demo model, and single waves varied by ~15% between runs.
    parser.add_argument(
        "--requests-per-client", type=int, default=2, help="requests each client sends in turn (default 2)"
    )
    parser.add_argument("--waves", type=int, default=1, help="waves per level; the median one is reported (default 1)")
    parser.add_argument(
        "--relay",
        default="asyncio",
        help="mlx-relay variants to run, each a phase of its own in this run, the first as the main contender: "
        f"{', '.join(VARIANTS)} (default asyncio)",
    )
    parser.add_argument(
        "--url", help="benchmark this running mlx-relay instead of starting one (it must serve --model)"
    )
    parser.add_argument("--skip", default="", help=f"comma-separated baselines to leave out: {', '.join(PEERS)}")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON, plot and logs go (default bench/out)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    workload = Workload(
        concurrency=tuple(int(n) for n in args.concurrency.split(",")),
        max_tokens=args.max_tokens,
        requests_per_client=args.requests_per_client,
        waves=args.waves,
    )
    variants = [name for name in args.relay.split(",") if name]
    if not variants or set(variants) - set(VARIANTS):
        raise SystemExit(f"--relay: unknown variant(s) in {args.relay!r}; choose from {list(VARIANTS)}")
    args.variants = variants
    skip = {name for name in args.skip.split(",") if name}
    if unknown := skip - set(PEERS):
        raise SystemExit(f"--skip: unknown baseline(s) {sorted(unknown)}; choose from {PEERS}")
    started_at = time.perf_counter()
    results, meta = _run_all(args, workload, skip)
    meta["wall_s"] = time.perf_counter() - started_at
    _publish(args, workload, results, meta)


def _model_path(model: str) -> str:
    """The directory (or repo id) every contender loads; demo models are built on first use."""
    from stages.models.demo import DEMO_MODELS, ensure_demo_model

    return str(ensure_demo_model(model)) if model in DEMO_MODELS else model


def _run_all(args: argparse.Namespace, workload: Workload, skip: set[str]) -> tuple[report.Results, dict[str, Any]]:
    from stages.models.demo import DEMO_MODELS

    path = _model_path(args.model)
    meta: dict[str, Any] = {"model": args.model, "model_path": path, "platform": platform.platform()}
    meta["cpus"] = os.cpu_count()
    results: report.Results = {}
    phases = 1 + len(args.variants) + (0 if "raw" in skip else 1) - (1 if "mlx_lm" in skip else 0)
    with tqdm(total=phases * len(workload.concurrency), unit="wave", desc="bench") as bar:
        if "raw" not in skip:
            bar.set_description("raw mlx-lm")
            records = run_raw(path, workload, args.out / "logs" / "raw.log", lambda r: _on_raw(r, bar))
            _file_raw(records, results, meta)
        phases_run: dict[str, _Phase] = {}
        for variant in args.variants:
            name = report.RELAY if variant == args.variants[0] else f"{report.RELAY} ({variant})"
            with _relay(args, path, frozenset(DEMO_MODELS), variant) as server:
                # Before and after: its own token count (and BLAS) to check ours
                # against; a `--url` server may have served others before.
                before = _generated(server)
                phases_run[name] = _serve_phase(server, workload, bar)
                if name == report.RELAY:
                    meta["relay_stats"] = httpx.get(f"{server.url}/stats", timeout=5).json()
                    meta["relay_stats_tokens"] = _generated(server) - before
        meta["relay_variants"] = args.variants
        if "mlx_lm" not in skip:
            port = free_port()
            with started(report.PEER, mlx_lm_command(path, port), port, os.environ, args.out / "logs") as server:
                phases_run[report.PEER] = _serve_phase(server, workload, bar)
    for name, phase in phases_run.items():
        results[name] = phase.summaries
    meta["checks"] = _checks(phases_run, meta["relay_stats_tokens"])
    return results, meta


def _on_raw(record: Record, bar: tqdm) -> None:
    if record["kind"] == "batch":
        bar.update(1)


def _file_raw(records: list[Record], results: report.Results, meta: dict[str, Any]) -> None:
    for record in records:
        kind = record.pop("kind")
        if kind == "info":
            meta["raw_info"] = record
        else:
            results.setdefault(f"raw_{kind}", {})[record["concurrency"]] = record


@contextlib.contextmanager
def _relay(args: argparse.Namespace, path: str, demo_names: frozenset[str], variant: str) -> Iterator[Server]:
    if args.url:
        server = Server(report.RELAY, args.url.rstrip("/"))
        wait_healthy(server)
        yield server
        return
    port = free_port()
    extra_args, settings = VARIANTS[variant]
    env = relay_env(args.model if args.model in demo_names else path, demo_names) | settings
    name = report.RELAY if variant == "asyncio" else f"{report.RELAY}-{variant}"
    with started(name, relay_command(port) + extra_args, port, env, args.out / "logs") as server:
        yield server


@attrs.define
class _Phase:
    summaries: dict[int, dict[str, Any]] = attrs.Factory(dict)
    texts: dict[str, str] = attrs.Factory(dict)  # each prompt's output
    tokens: int = 0  # all completion tokens the server reported, warm-up included


def _serve_phase(server: Server, workload: Workload, bar: tqdm) -> _Phase:
    """Warm up, then one wave per level."""
    bar.set_description(server.name)
    return asyncio.run(_drive(server, workload, bar))


async def _drive(server: Server, workload: Workload, bar: tqdm) -> _Phase:
    phase = _Phase()
    warm = await warm_up(server.url, WARMUP_PROMPT, workload.max_tokens)
    if warm.error:
        tqdm.write(f"{server.name}: warm-up failed: {warm.error}")
    phase.tokens += warm.completion_tokens
    for level in workload.concurrency:
        summaries = []
        for index in range(workload.waves):
            summaries.append(await _measured_wave(server, level, index, workload, phase))
        summaries.sort(key=lambda summary: float(summary["tokens_per_s"]))
        phase.summaries[level] = {
            **summaries[len(summaries) // 2],
            "waves_tokens_per_s": [s["tokens_per_s"] for s in summaries],
        }
        bar.update(1)
    return phase


async def _measured_wave(server: Server, level: int, index: int, workload: Workload, phase: _Phase) -> dict[str, Any]:
    """One wave's summary, with the server's CPU per 1,000 tokens and (mlx-relay) its model thread's waits."""
    pid = server.process.pid if server.process is not None else None
    cpu_before = tree_cpu_seconds(pid) if pid is not None else None
    split_before = tree_cpu_split(pid) if pid is not None else None
    waits_before = _thread_waits(server)
    wave = await run_wave(server.url, level, workload, wave=index)
    cpu_after = tree_cpu_seconds(pid) if pid is not None else None
    split_after = tree_cpu_split(pid) if pid is not None else None
    waits_after = _thread_waits(server)
    summary = summarize(wave, workload.max_tokens)
    tokens = int(summary["completion_tokens"])  # type: ignore[call-overload]  # summarize's values are objects
    if cpu_before is not None and cpu_after is not None and tokens:
        summary["cpu_s_per_1k_tokens"] = (cpu_after - cpu_before) / tokens * 1000
    if split_before is not None and split_after is not None and tokens:
        # The HTTP front and the model worker apart (a worker restarted mid-wave would make this meaningless).
        summary["cpu_front_s_per_1k_tokens"] = (split_after[0] - split_before[0]) / tokens * 1000
        summary["cpu_worker_s_per_1k_tokens"] = (split_after[1] - split_before[1]) / tokens * 1000
    if waits_before is not None and waits_after is not None:
        # Of the wave's wall time the thread was not idle, the share it spent waiting on the loop.
        busy = wave.wall - (waits_after[1] - waits_before[1])
        summary["loop_wait_share"] = (waits_after[0] - waits_before[0]) / busy if busy > 0 else None
    phase.texts.update({r.prompt: r.text for r in wave.requests if r.error is None})
    phase.tokens += sum(r.completion_tokens for r in wave.requests)
    return summary


def _thread_waits(server: Server) -> tuple[float, float] | None:
    """mlx-relay's model thread: seconds waiting on the loop, and idle; None for another server."""
    if server.name != report.RELAY:
        return None
    handoff = httpx.get(f"{server.url}/stats", timeout=5).json().get("gateway", {}).get("handoff")
    return (float(handoff["loop_wait_s"]), float(handoff["idle_wait_s"])) if handoff else None


def _generated(server: Server) -> int:
    stats = httpx.get(f"{server.url}/stats", timeout=5).json()
    return int(stats.get("gateway", {}).get("generated_tokens", 0))


def _checks(phases: dict[str, _Phase], relay_stats_tokens: int) -> dict[str, Any]:
    """Cheap evidence that the numbers mean what they say."""
    checks: dict[str, Any] = {"relay_usage_tokens": phases[report.RELAY].tokens}
    checks["relay_stats_generated_tokens"] = relay_stats_tokens
    if report.PEER in phases:
        # Same model, same prompts, greedy: the outputs should agree (batched
        # float arithmetic can still flip a near-tie now and then).
        relay, peer = phases[report.RELAY].texts, phases[report.PEER].texts
        shared = relay.keys() & peer.keys()
        checks["identical_outputs"] = [sum(relay[p] == peer[p] for p in shared), len(shared)]
    return checks


VARIANT_HEADER = ("N", "variant", "tok/s", "vs main relay", "TTFT p50 ms", "CPU s/1k tok")


def _variant_rows(results: report.Results, names: list[str], levels: tuple[int, ...]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for n in levels:
        main = results.get(report.RELAY, {}).get(n, {})
        for name in names:
            row = results[name].get(n, {})
            rate, base = row.get("tokens_per_s"), main.get("tokens_per_s")
            rows.append(
                (
                    str(n),
                    name,
                    f"{rate:.0f}" if rate else "-",
                    f"{rate / base:.2f}x" if rate and base else "-",
                    f"{row['ttft_p50_ms']:.0f}" if row.get("ttft_p50_ms") is not None else "-",
                    f"{row['cpu_s_per_1k_tokens']:.2f}" if row.get("cpu_s_per_1k_tokens") is not None else "-",
                )
            )
    return rows


def _publish(args: argparse.Namespace, workload: Workload, results: report.Results, meta: dict[str, Any]) -> None:
    levels = workload.concurrency
    table = report.rows(results, levels)
    checks = meta["checks"]
    title = f"{args.model}, max_tokens={workload.max_tokens}, {workload.requests_per_client} request(s)/client"
    if workload.waves > 1:
        title += f", median of {workload.waves} waves"
    print(f"\nServing benchmark: {title}\n")
    print(report.plain_table(table))
    if report.RAW in results:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        print(
            f"\nWhat {cores} cores leave a server while the client shares them (ceiling: the most a server costing"
            " nothing could reach, at raw mlx-lm's CPU per token plus the client's; never above raw):\n"
        )
        ceiling = report.ceiling_rows(results, levels, cores)
        print(report.plain_table(ceiling, report.CEILING_HEADER))
        print("\n" + report.markdown_table(ceiling, report.CEILING_HEADER))
    if others := [name for name in results if name.startswith(report.RELAY + " (")]:
        print("\nmlx-relay variants, same run:\n")
        print(report.plain_table(_variant_rows(results, others, levels), VARIANT_HEADER))
    print_process_cpu(results, levels)
    notes = [f"BLAS: {meta.get('raw_info', {}).get('blas') or meta.get('relay_stats', {}).get('blas')}"]
    notes.append(
        f"mlx-relay tokens: {checks['relay_usage_tokens']} by usage, {checks['relay_stats_generated_tokens']} by /stats"
    )
    if "identical_outputs" in checks:
        notes.append("identical greedy outputs, mlx-relay vs mlx_lm.server: {}/{}".format(*checks["identical_outputs"]))
    notes += [f"WARNING {problem}" for problem in report.problems(results, workload.max_tokens)]
    notes.append(f"total wall time {meta['wall_s']:.1f} s")
    print("\n" + "\n".join(notes))
    print("\nMarkdown:\n\n" + report.markdown_table(table) + "\n")
    payload = {
        "workload": {
            "concurrency": list(levels),
            "max_tokens": workload.max_tokens,
            "requests_per_client": workload.requests_per_client,
            "waves": workload.waves,
        },
        "meta": meta,
        "results": results,
    }
    report.write_json(args.out / "serving.json", payload)
    report.plot(args.out / "serving.png", results, levels, title)
    print(f"wrote {args.out / 'serving.json'} and {args.out / 'serving.png'}")


if __name__ == "__main__":
    main()
