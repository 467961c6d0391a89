"""Scale-out benchmark: one multi-turn workload through routers over 3 replicas, and a failover run.

    python -m bench.scaleout [--replicas 3] [--conversations 7] [--turns 4] [--model tiny] [--skip-haproxy]

The workload: N conversations, each with its own long system prompt, of T
turns that each resend the whole history with one new question (streamed
chat completions, temperature 0). The conversations run side by side, one
thread each. Each router run starts fresh replicas (cold caches), so no run
inherits another's cache. Routers: smg `cache_aware` and `round_robin`
(HTTP mode; smg drops `x-session-affinity`), HAProxy hashing on the
session header (deploy/haproxy.cfg) and HAProxy with no key (round robin).

Reported per run: the cached share of prompt tokens (`usage.prompt_tokens_details.cached_tokens`
over prompt tokens), against the workload's ceiling (every token a turn
resends from the turn before was cached; first turns never are), TTFT p50/p95
per turn, and requests per replica (`/stats` `submitted`).

The failover run: smg `cache_aware` over replicas sharing one Responses
store (`--store`, default one SQLite file); the conversations chain
Responses turns with `previous_response_id`, streamed. While turn
`--kill-turn` is in flight, replica 0 is killed (SIGKILL). Counted: requests
that failed, and how (an HTTP error, `response.failed`, or a broken
stream: each a clean end at the client, never a hang); requests after the
kill per replica; and `previous_response_id` lookups that answered 404.
A failed turn is retried once on the same previous id.

Writes bench/out/scaleout.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import httpx

from bench.servers import REPO

sys.path.insert(0, str(REPO))
from bench.scaleout_cluster import in_threads, model_id, replica_env, submitted, system_prompt
from bench.scaleout_failover import failover_run
from deploy.scaleout import Cluster

OUT = Path(__file__).resolve().parent / "out"
_TIMEOUT = httpx.Timeout(300.0, connect=10.0)


@attrs.define
class TurnResult:
    conversation: int
    turn: int
    ttft: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.scaleout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=7)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=300, help="each conversation's system prompt, in words")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--model", default="tiny", help="a built-in model (tiny, demo, smollm2) or MLX_RELAY_MODEL value"
    )
    parser.add_argument("--skip-haproxy", action="store_true")
    parser.add_argument("--store", help="the failover run's shared Responses store URL (default: one SQLite file)")
    parser.add_argument("--kill-turn", type=int, default=3, help="the failover run kills replica 0 during this turn")
    parser.add_argument("--only-failover", action="store_true", help="skip the router runs")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def chat_turn(
    url: str, model: str, messages: list[dict[str, str]], max_tokens: int, headers: dict[str, str]
) -> tuple[str, float, dict[str, Any]]:
    """One streamed turn: (answer, seconds to the first content, usage)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, first, text, usage = time.perf_counter(), None, [], {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=_TIMEOUT) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            for choice in chunk.get("choices") or []:
                if choice.get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
            usage = chunk.get("usage") or usage
    return "".join(text), (first or time.perf_counter()) - started, usage


def run_conversations(url: str, model: str, args: argparse.Namespace, *, keyed: bool) -> list[TurnResult]:
    results: list[TurnResult] = []
    lock = threading.Lock()

    def conversation(index: int) -> None:
        headers = {"x-session-affinity": f"conversation-{index}"} if keyed else {}
        messages = [{"role": "system", "content": system_prompt(index, args.system_words)}]
        for turn in range(1, args.turns + 1):
            messages.append({"role": "user", "content": f"Question {turn}: which word comes {turn}th?"})
            answer, ttft, usage = chat_turn(url, model, messages, args.max_tokens, headers)
            messages.append({"role": "assistant", "content": answer})
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            with lock:
                results.append(
                    TurnResult(index, turn, ttft, usage["prompt_tokens"], cached, usage["completion_tokens"])
                )

    in_threads(args.conversations, conversation)
    return results


def summarise(results: list[TurnResult], per_replica: list[int]) -> dict[str, Any]:
    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)
    by_key = {(r.conversation, r.turn): r for r in results}
    # The ceiling: a turn can reuse what the turn before sent and received; a first turn nothing.
    ceiling = sum(
        min(
            r.prompt_tokens,
            by_key[(r.conversation, r.turn - 1)].prompt_tokens + by_key[(r.conversation, r.turn - 1)].completion_tokens,
        )
        for r in results
        if r.turn > 1
    )
    turns: dict[str, Any] = {}
    for turn in sorted({r.turn for r in results}):
        ttfts = sorted(r.ttft for r in results if r.turn == turn)
        turns[str(turn)] = {
            "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
            "ttft_p95_ms": round(1000 * _quantile(ttfts, 0.95), 1),
        }
    return {
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 3) if prompt else 0.0,
        "ceiling": round(ceiling / prompt, 3) if prompt else 0.0,
        "per_turn": turns,
        "requests_per_replica": per_replica,
    }


def _quantile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def routed_run(args: argparse.Namespace, router: str, policy: str, *, keyed: bool) -> dict[str, Any]:
    cluster = Cluster.create(run_dir=args.out / "logs" / f"scaleout-{router}-{policy}")
    try:
        cluster.start_replicas(args.replicas, env=replica_env(args.model))
        url = cluster.start_smg(policy=policy) if router == "smg" else cluster.start_haproxy()
        before = submitted(cluster)
        results = run_conversations(url, model_id(cluster), args, keyed=keyed)
        after = submitted(cluster)
        return {
            "router": router,
            "policy": policy,
            **summarise(results, [a - b for a, b in zip(after, before, strict=True)]),
        }
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = (
        []
        if args.only_failover
        else [routed_run(args, "smg", "cache_aware", keyed=True), routed_run(args, "smg", "round_robin", keyed=True)]
    )
    if not args.skip_haproxy and not args.only_failover:
        runs += [
            routed_run(args, "haproxy", "hash x-session-affinity", keyed=True),
            routed_run(args, "haproxy", "no key (round robin)", keyed=False),
        ]
    print(f"{'router':8} {'policy':26} {'cached':>7} {'ceiling':>8}  per replica   TTFT p50/p95 ms per turn")
    for run in runs:
        ttft = "  ".join(f"{t['ttft_p50_ms']:.0f}/{t['ttft_p95_ms']:.0f}" for t in run["per_turn"].values())
        shares = f"{run['cached_share']:7.3f} {run['ceiling']:8.3f}  {run['requests_per_replica']!s:13}"
        print(f"{run['router']:8} {run['policy']:26} {shares} {ttft}")
    failover = failover_run(args)
    print(json.dumps(failover, indent=2))
    name = "scaleout-failover.json" if args.only_failover else "scaleout.json"
    (args.out / name).write_text(json.dumps({"runs": runs, "failover": failover}, indent=2))


if __name__ == "__main__":
    main()
