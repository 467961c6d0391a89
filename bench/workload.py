"""What every contender is asked to do: the prompts and the per-request limits.

The servers and the raw mlx-lm baseline import the same prompts from here,
so a ratio compares the same work. Nothing here imports mlx: the parent
process of the benchmark never runs the model.
"""

from __future__ import annotations

import attrs

_TOPICS = (
    "the history of the printing press",
    "how bees find their way home",
    "why the sky looks blue at noon",
    "the rules of chess for a beginner",
    "how a steam engine turns heat into work",
    "the life cycle of a star",
    "what makes bread rise in the oven",
    "how tides follow the moon",
    "the way a compiler reads a program",
    "why cats sleep so much of the day",
    "how rivers carve canyons over time",
    "the first voyages around the world",
    "how vaccines teach the body to fight",
    "why leaves change colour in autumn",
    "the ideas behind a relational database",
    "how a bicycle stays upright",
    "the invention of the telephone",
)


@attrs.frozen(kw_only=True)
class Workload:
    concurrency: tuple[int, ...]
    max_tokens: int
    requests_per_client: int
    # Waves per level (each with prompts of its own); the median one is reported.
    waves: int = 1
    # 0 is greedy; above it every server samples (no seed, no filters), as most chat clients ask.
    temperature: float = 0.0


def prompt(level: int, client: int, request: int) -> str:
    """A prompt unique to one request of one client at one concurrency level.

    Unique across levels too: mlx_lm.server keeps an LRU prompt cache, and a
    prompt repeated from an earlier level would skip its prefill there.
    """
    topic = _TOPICS[(client + request * 7) % len(_TOPICS)]
    return f"Request {level}.{client}.{request}: tell me about {topic}, in a few plain sentences."


def wave_prompts(level: int, request: int) -> list[str]:
    """The prompts the `level` clients send as their `request`-th request."""
    return [prompt(level, client, request) for client in range(level)]


WARMUP_PROMPT = "Warm-up: say something about the weather, in a few plain sentences."
