"""The failover run of bench/scaleout.py: a replica killed mid-run under Responses chains.

Each conversation chains streamed Responses turns with `previous_response_id`
through smg `cache_aware`; the replicas share one Responses store. During
turn `--kill-turn` replica 0 is killed. Each request ends one of these ways,
all counted: completed; failed at the client (HTTP error status, a
`response.failed` event, or a stream that broke); or a 404 for its
`previous_response_id`, which a shared store must make 0. A failed turn is
retried once with the same previous id.
"""

from __future__ import annotations

import argparse
import collections
import json
import threading
import time
from typing import Any

import httpx

from bench.scaleout_cluster import Cluster, in_threads, model_id, replica_env, submitted, system_prompt

_TIMEOUT = httpx.Timeout(120.0, connect=10.0)
# Long enough answers that turns are in flight when the replica dies.
_KILL_TURN_TOKENS = 600


def responses_turn(url: str, body: dict[str, Any]) -> tuple[str, str | None]:
    """(outcome, response id): completed / http_<status> / not_found / response.failed / broken_stream."""
    try:
        with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}, timeout=_TIMEOUT) as response:
            if response.status_code != 200:
                text = response.read().decode(errors="replace")
                return ("not_found" if response.status_code == 404 else f"http_{response.status_code}"), text[:200]
            last: dict[str, Any] = {}
            raw = ""
            for line in response.iter_lines():
                if line.startswith("data: "):
                    raw = line.removeprefix("data: ")
                    try:
                        last = json.loads(raw)
                    except ValueError:
                        last = {}  # a router's own frame ([DONE], or its error text)
            kind = last.get("type")
            if kind in ("response.completed", "response.incomplete"):
                return "completed", str(last["response"]["id"])
            if kind == "response.failed":
                return "response.failed", None
            return ("router_error" if "error" in raw else "broken_stream"), raw[:200]
    except httpx.HTTPError as error:
        return "broken_stream", type(error).__name__


def failover_run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = Cluster.create(args.store, run_dir=args.out / "logs" / "scaleout-failover")
    outcomes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    killed = threading.Event()
    try:
        cluster.start_replicas(args.replicas, env=replica_env(args.model))
        url = cluster.start_smg(policy="cache_aware")
        model = model_id(cluster)
        at_kill: list[int] = []
        in_flight: list[int] = []
        failures: list[str] = []
        turn_started = threading.Barrier(args.conversations + 1)

        def conversation(index: int) -> None:
            previous: str | None = None
            instructions = system_prompt(index, args.system_words)
            for turn in range(1, args.turns + 3):
                if turn == args.kill_turn:
                    turn_started.wait()
                body: dict[str, Any] = {
                    "model": model,
                    "instructions": instructions,
                    "input": f"Question {turn}.",
                    "temperature": 0,
                    "max_output_tokens": _KILL_TURN_TOKENS if turn == args.kill_turn else args.max_tokens,
                }
                if previous is not None:
                    body["previous_response_id"] = previous
                for attempt in range(2):
                    outcome, response_id = responses_turn(url, body)
                    with lock:
                        outcomes[f"{'after' if killed.is_set() else 'before'}_kill:{outcome}"] += 1
                        if outcome != "completed" and len(failures) < 5:
                            failures.append(f"{outcome}: {response_id}")
                    if outcome == "completed":
                        previous = response_id
                        break
                    time.sleep(1.0 + attempt)

        def killer() -> None:
            turn_started.wait()
            time.sleep(0.3)  # the turn's requests are streaming now
            at_kill.extend(submitted(cluster))
            in_flight.append(_in_flight(cluster.replicas[0].url))
            cluster.kill_replica(0)
            killed.set()

        thread = threading.Thread(target=killer)
        thread.start()
        in_threads(args.conversations, conversation)
        thread.join()
        after = submitted(cluster)
        return {
            "store": cluster.store.split("@")[-1],
            "in_flight_on_killed_replica": in_flight[0] if in_flight else None,
            "outcomes": dict(sorted(outcomes.items())),
            "failures_seen": failures,
            "previous_id_404s": sum(n for key, n in outcomes.items() if key.endswith(":not_found")),
            "requests_per_replica_after_kill": [b - a if b >= 0 else None for a, b in zip(at_kill, after, strict=True)],
        }
    finally:
        cluster.stop()


def _in_flight(url: str) -> int:
    return int(httpx.get(f"{url}/stats", timeout=10).json()["admission"]["in_flight"])
