"""What the scale-out benchmark's runs share: the replicas' model, the conversations' prompts, their threads, and
what each replica served. Apart from bench/scaleout.py so its failover run (bench/scaleout_failover.py) imports them
without importing the module that runs it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import httpx

from bench.servers import REPO

sys.path.insert(0, str(REPO))
from deploy.scaleout import Cluster

_WORDS = [
    "river",
    "stone",
    "lantern",
    "orchard",
    "copper",
    "meadow",
    "harbor",
    "violet",
    "summit",
    "falcon",
    "ember",
    "willow",
    "canyon",
]


def replica_env(model: str) -> dict[str, str]:
    return {"MLX_RELAY_DEMO_MODEL": model} if model in ("tiny", "demo", "smollm2") else {"MLX_RELAY_MODEL": model}


def system_prompt(conversation: int, words: int) -> str:
    picked = [_WORDS[(conversation * 7 + i * (conversation + 3)) % len(_WORDS)] for i in range(words)]
    return f"Conversation {conversation}. Remember these words: " + " ".join(picked)


def in_threads(count: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            work(index)
        except BaseException as error:  # noqa: BLE001 -- re-raised in the caller's thread once all have joined
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def submitted(cluster: Cluster) -> list[int]:
    counts = []
    for replica in cluster.replicas:
        try:
            counts.append(int(httpx.get(f"{replica.url}/stats", timeout=10).json()["submitted"]))
        except httpx.HTTPError:
            counts.append(-1)  # gone
    return counts


def model_id(cluster: Cluster) -> str:
    return str(httpx.get(f"{cluster.replicas[0].url}/v1/models", timeout=10).json()["data"][0]["id"])
