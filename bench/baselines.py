"""Raw mlx-lm on the same model and prompts: the ceiling the servers are held to.

Runs as its own process (`python -m bench.baselines ...`, started by
`run_raw`), so its MLX never shares the CPUs with a server: the phases of
a benchmark run one after another. It drives `BatchGenerator` directly at
batch size N, and for N = 1 also `stream_generate`, and prints one marked
JSON line per measurement for the parent to collect.

This module imports mlx only inside the child, after the BLAS preload:
the BLAS is chosen when mlx is first imported (stages/models/blas.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.servers import REPO
from bench.workload import WARMUP_PROMPT, Workload, prompt, wave_prompts

# mlx.nn.Module and mlx_lm's TokenizerWrapper: mlx ships no types mypy can
# use, and naming them here would import mlx before the BLAS preload.
Model = Any
Tokenizer = Any
# Marks the child's result lines; anything else on its stdout is ignored.
MARK = "BENCH-RESULT "
Record = dict[str, Any]


def run_raw(model_path: str, workload: Workload, log_path: Path, on_record: Callable[[Record], None]) -> list[Record]:
    """Run the baseline child to completion; return its records as they came.

    Raises:
        RuntimeError: the child failed; the message names its log.
    """
    command = [sys.executable, "-m", "bench.baselines", "--model", model_path, "--max-tokens", str(workload.max_tokens)]
    command += ["--concurrency", ",".join(map(str, workload.concurrency))]
    command += ["--requests-per-client", str(workload.requests_per_client), "--waves", str(workload.waves)]
    records: list[Record] = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        log_path.open("w") as log,
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True) as child,
    ):
        assert child.stdout is not None  # stdout=PIPE
        for line in child.stdout:
            if line.startswith(MARK):
                records.append(json.loads(line.removeprefix(MARK)))
                on_record(records[-1])
    if child.returncode != 0:
        raise RuntimeError(f"raw mlx-lm baseline exited with {child.returncode}; see {log_path}")
    return records


def _emit(record: Record) -> None:
    print(MARK + json.dumps(record), flush=True)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    workload = Workload(
        concurrency=tuple(int(n) for n in args.concurrency.split(",")),
        max_tokens=args.max_tokens,
        requests_per_client=args.requests_per_client,
        waves=args.waves,
    )
    from stages.models.blas import preload_blas

    blas = preload_blas()
    import mlx_lm  # only now: mlx binds its BLAS when it is first imported

    model, tokenizer = mlx_lm.load(args.model)[:2]
    _emit({"kind": "info", "blas": blas, "mlx": version("mlx"), "mlx_lm": version("mlx-lm")})
    # Warm-up, as the servers get one: first calls pay one-time setup costs.
    _batch_once(model, tokenizer, [WARMUP_PROMPT], workload.max_tokens)
    _stream_once(model, tokenizer, WARMUP_PROMPT, workload.max_tokens)
    if args.serve:
        _serve(model, tokenizer, workload)
        return
    for level in workload.concurrency:
        _emit(
            {
                "kind": "batch",
                **_median([_measure_batch(model, tokenizer, level, w, workload) for w in range(workload.waves)]),
            }
        )
        if level == 1:
            _emit(
                {
                    "kind": "stream",
                    **_median([_measure_stream(model, tokenizer, w, workload) for w in range(workload.waves)]),
                }
            )


def _serve(model: Model, tokenizer: Tokenizer, workload: Workload) -> None:
    """One measurement per line read (`{"kind": "batch"|"stream", "level": N, "wave": W}`), until stdin ends:
    bench/interleaved.py keeps this process between its waves."""
    for line in sys.stdin:
        asked = json.loads(line)
        level, wave = int(asked["level"]), int(asked["wave"])
        if asked["kind"] == "stream":
            _emit({"kind": "stream", **_measure_stream(model, tokenizer, wave, workload)})
        elif asked["kind"] == "clients":
            _emit({"kind": "clients", **_measure_clients(model, tokenizer, level, wave, workload)})
        else:
            _emit({"kind": "batch", **_measure_batch(model, tokenizer, level, wave, workload)})


def _median(records: list[Record]) -> Record:
    """The median wave by throughput, as the servers' are chosen."""
    records.sort(key=lambda record: float(record["tokens_per_s"]))
    return {**records[len(records) // 2], "waves_tokens_per_s": [r["tokens_per_s"] for r in records]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Raw mlx-lm baseline (started by bench.serving).")
    parser.add_argument("--model", required=True, help="model directory or repo id for mlx_lm.load")
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=1)
    parser.add_argument("--waves", type=int, default=1)
    parser.add_argument("--serve", action="store_true", help="measure what each stdin line asks for, then exit")
    return parser


def _measure_batch(model: Model, tokenizer: Tokenizer, level: int, wave: int, workload: Workload) -> Record:
    """One batch of `level` prompts per round, as many rounds as requests per client."""
    tokens, wall, cpu, short, first = 0, 0.0, 0.0, 0, list[float]()
    start = wave * workload.requests_per_client
    for request in range(start, start + workload.requests_per_client):
        # The process's CPU, mlx's compute and BLAS threads included: what the model alone costs the machine.
        cpu_start = time.process_time()
        counts, elapsed, ttfts = _batch_once(model, tokenizer, wave_prompts(level, request), workload.max_tokens)
        cpu += time.process_time() - cpu_start
        tokens, wall, first = tokens + sum(counts), wall + elapsed, first + ttfts
        short += sum(1 for count in counts if count != workload.max_tokens)
    first.sort()
    return {**_figures(level, tokens, wall, cpu), "short": short, "first_token_p50_ms": first[len(first) // 2] * 1000}


def _figures(level: int, tokens: int, wall: float, cpu: float) -> Record:
    """What every measurement reports: its tokens, wall time and the process's CPU per 1,000 tokens."""
    return {
        "concurrency": level,
        "completion_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "cpu_s_per_1k_tokens": cpu / tokens * 1000 if tokens else None,
    }


def _batch_once(
    model: Model, tokenizer: Tokenizer, prompts: list[str], max_tokens: int
) -> tuple[list[int], float, list[float]]:
    """Generated tokens per row, wall seconds, and each row's time to first token."""
    from mlx_lm.generate import BatchGenerator

    # Tokenized as both servers tokenize a /v1/completions prompt
    # (tokenizer.encode with its defaults), and before the clock starts:
    # the raw baseline is the ideal, with no request handling at all.
    encoded = [tokenizer.encode(text) for text in prompts]
    # Batch sizes fit the whole wave, so every row is prefilled and decoded together.
    generator = BatchGenerator(
        model,
        stop_tokens=[[token] for token in sorted(tokenizer.eos_token_ids)],
        completion_batch_size=len(prompts),
        prefill_batch_size=len(prompts),
    )
    start = time.perf_counter()
    uids = generator.insert(encoded, max_tokens=[max_tokens] * len(prompts))
    counts, firsts, pending = dict.fromkeys(uids, 0), dict[int, float](), set(uids)
    while pending:
        for response in generator.next()[1]:
            firsts.setdefault(response.uid, time.perf_counter() - start)
            # A "stop" response carries the EOS token, which is not output text.
            counts[response.uid] += response.finish_reason != "stop"
            if response.finish_reason is not None:
                pending.discard(response.uid)
    wall = time.perf_counter() - start
    generator.close()
    return [counts[uid] for uid in uids], wall, list(firsts.values())


def _measure_clients(model: Model, tokenizer: Tokenizer, level: int, wave: int, workload: Workload) -> Record:
    """`BatchGenerator` fed as the servers' clients feed a server: `level` clients, each sending its next request
    the moment its last reply ends (bench/load.py's `run_wave`), so rows arrive, prefill beside decoding rows and
    finish at their own times. `_measure_batch` hands each round's prompts over at once instead: the difference
    between the two is what the arrival shape costs, with no server at all."""
    from mlx_lm.generate import BatchGenerator

    first = wave * workload.requests_per_client
    queues = [
        [
            tokenizer.encode(prompt(level, client, request))
            for request in range(first, first + workload.requests_per_client)
        ]
        for client in range(level)
    ]
    generator = BatchGenerator(
        model,
        stop_tokens=[[token] for token in sorted(tokenizer.eos_token_ids)],
        completion_batch_size=level,
        prefill_batch_size=level,
    )
    cpu_start, start = time.process_time(), time.perf_counter()
    owner: dict[int, int] = {}
    for client, queue in enumerate(queues):
        owner[generator.insert([queue.pop(0)], max_tokens=[workload.max_tokens])[0]] = client
    tokens = 0
    while owner:
        for response in generator.next()[1]:
            tokens += response.finish_reason != "stop"
            if response.finish_reason is None:
                continue
            client = owner.pop(response.uid)
            if queues[client]:
                owner[generator.insert([queues[client].pop(0)], max_tokens=[workload.max_tokens])[0]] = client
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    generator.close()
    return _figures(level, tokens, wall, cpu)


def _measure_stream(model: Model, tokenizer: Tokenizer, wave: int, workload: Workload) -> Record:
    tokens, wall, cpu = 0, 0.0, 0.0
    start = wave * workload.requests_per_client
    for request in range(start, start + workload.requests_per_client):
        # As for the batch: the process's CPU, mlx's threads included (the worker's N=1 target is against it).
        cpu_start = time.process_time()
        count, elapsed = _stream_once(model, tokenizer, wave_prompts(1, request)[0], workload.max_tokens)
        cpu += time.process_time() - cpu_start
        tokens, wall = tokens + count, wall + elapsed
    return _figures(1, tokens, wall, cpu)


def _stream_once(model: Model, tokenizer: Tokenizer, text: str, max_tokens: int) -> tuple[int, float]:
    from mlx_lm.generate import stream_generate

    encoded = tokenizer.encode(text)
    start = time.perf_counter()
    # Only the last response matters: it carries the totals.
    last = next(iter(deque(stream_generate(model, tokenizer, encoded, max_tokens=max_tokens), maxlen=1)), None)
    wall = time.perf_counter() - start
    if last is None:
        return 0, wall
    # The last response's count includes the EOS token when it stopped on one.
    return last.generation_tokens - (last.finish_reason == "stop"), wall


if __name__ == "__main__":
    main()
