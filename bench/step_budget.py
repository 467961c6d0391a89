"""Running streams' inter-token gaps while a long prompt arrives: fixed prefill chunks against the step budget.

Two servers of the same model, one after the other: one whose steps are
bounded by tokens only (`MLX_RELAY_STEP_BUDGET_MS` so large that every
chunk is `prefill_step_size`, 512 tokens a row, as before the budget), and
one with the default 200 ms budget. In each, `--streams` chat streams
decode; once each has given a few tokens a long prompt (token ids through
/v1/completions, `--prompt-tokens` of them, one token asked) arrives, and
the gaps between the streams' tokens while it prefills are their p50 /
p95 / max. The ratio of the two p95s is the figure (one run, both sides
on the same machine state); the long prompt's own time to its token is
the price. Writes step_budget.json under --out.

    python -m bench.step_budget --model demo --prompt-tokens 3800
    python -m bench.step_budget --model smollm2 --prompt-tokens 8000
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.load import percentile
from bench.servers import free_port, relay_command, relay_env, started

DEMOS = frozenset({"demo", "tiny", "smollm2"})
# A budget no step reaches: every chunk is prefill_step_size tokens, as before the budget.
UNBOUNDED_MS = "1000000000"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--prompt-tokens", type=int, default=3800)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--budget-ms", default="200")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    return parser


def _stream(url: str, index: int, arrivals: list[float], stop: threading.Event) -> None:
    body = {
        "messages": [{"role": "user", "content": f"Tell me about {index}."}],
        "max_tokens": 4000,
        "temperature": 1.0,
        "seed": index,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                arrivals.append(time.perf_counter())
            if stop.is_set():
                return


def _during_long_prompt(url: str, streams: int, prompt_tokens: int) -> dict[str, Any]:
    arrivals: list[list[float]] = [[] for _ in range(streams)]
    stop = threading.Event()
    threads = [threading.Thread(target=_stream, args=(url, i, arrivals[i], stop)) for i in range(streams)]
    for thread in threads:
        thread.start()
    try:
        while min(map(len, arrivals)) < 5:
            time.sleep(0.01)
        # Ids of the model's ordinary vocabulary, different from any earlier run's prompt (no cache hit).
        prompt = [200 + (i * 7919) % 4000 for i in range(prompt_tokens)]
        began = time.perf_counter()
        response = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=3600)
        response.raise_for_status()
        ended = time.perf_counter()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    pairs = [(earlier, later) for times in arrivals for earlier, later in itertools.pairwise(times)]
    gaps = [later - earlier for earlier, later in pairs if began <= later <= ended]
    quantiles = {f"p{q}_ms": round((percentile(gaps, q) or 0.0) * 1000, 1) for q in (50, 95)}
    longest = round(max(gaps, default=0.0) * 1000, 1)
    return {"long_prompt_s": round(ended - began, 3), "gaps": len(gaps), **quantiles, "max_ms": longest}


def _run(args: argparse.Namespace, budget_ms: str) -> dict[str, Any]:
    port = free_port()
    env = relay_env(args.model, DEMOS) | {"MLX_RELAY_STEP_BUDGET_MS": budget_ms}
    with started(f"relay-step-budget-{budget_ms}", relay_command(port), port, env, args.out / "logs") as server:
        httpx.post(f"{server.url}/v1/completions", json={"prompt": [300] * 64, "max_tokens": 4}, timeout=600)  # warm-up
        figures = _during_long_prompt(server.url, args.streams, args.prompt_tokens)
        gateway = httpx.get(f"{server.url}/stats", timeout=10).json()["gateway"]
    return figures | {"steps_over_budget": gateway["steps_over_budget"]}


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    fixed = _run(args, UNBOUNDED_MS)
    budget = _run(args, args.budget_ms)
    ratio = round(fixed["p95_ms"] / max(budget["p95_ms"], 1e-9), 2)
    result = {
        "model": args.model,
        "prompt_tokens": args.prompt_tokens,
        "streams": args.streams,
        "budget_ms": args.budget_ms,
        "fixed_chunks": fixed,
        "step_budget": budget,
        "p95_ratio": ratio,
    }
    for name, figures in (("fixed 512-token chunks", fixed), (f"{args.budget_ms} ms step budget", budget)):
        gaps = f"p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, max {figures['max_ms']} ms"
        print(
            f"{name}: streams' gaps {gaps} "
            f"({figures['gaps']} gaps); the {args.prompt_tokens}-token prompt took {figures['long_prompt_s']} s"
        )
    print(f"p95 gap, fixed / budget: {result['p95_ratio']}x")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"step_budget-{args.model}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
