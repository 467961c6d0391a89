"""stages/cache/prompt.py: the cap bounds what the cache costs the process, not only its KV bytes.

A soak once saw RSS minus the cache's byte figure grow 110 → 332 MiB at
4,061 entries: the key tuples and the PromptTrie's dict per token, which
the figure left out. An entry's cost now counts them
(`tier.HOST_BYTES_PER_*`); this checks, with tracemalloc, that the figures
still cover what Python really allocates, and that the entry cap holds.
"""

from __future__ import annotations

import gc
import random
import tracemalloc

from stages.cache.prompt import PromptCache
from stages.cache.tier import Entry
from tests.stages.cache.test_prompt_cache import cost, kv

ENTRIES, TOKENS = 300, 200


def distinct_prompts(seed: int) -> list[tuple[int, ...]]:
    # Ids past the small-int cache, as real vocabularies' are: each one is an int object of its own.
    rng = random.Random(seed)
    return [tuple(rng.randrange(1000, 150_000) for _ in range(TOKENS)) for _ in range(ENTRIES)]


def test_an_entry_costs_at_least_what_python_holds_for_it() -> None:
    """What Python allocates to make and keep entries (token ids, key tuples, the trie, the layer objects)
    stays under the host bytes the cache counts for them, and not far under."""
    cache = PromptCache(max_bytes=1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for prompt in distinct_prompts(1):
            cache.store(Entry(tokens=prompt, cache=kv(4), prompt_len=TOKENS))
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stats = cache.statistics()
    counted_host = stats.bytes - stats.kv_bytes
    assert stats.entries == ENTRIES
    assert grown <= counted_host <= 2 * grown, (grown, counted_host)


def test_the_entry_cap_evicts_the_least_recently_used() -> None:
    cache = PromptCache(max_bytes=1 << 40, max_entries=5)
    prompts = [tuple(range(k * 1000, k * 1000 + 8)) for k in range(1, 9)]
    for prompt in prompts:
        cache.store(Entry(tokens=prompt, cache=kv(8), prompt_len=8))
    stats = cache.statistics()
    assert (stats.entries, stats.evictions, stats.max_entries) == (5, 3, 5)
    assert stats.bytes == 5 * cost(8)
    assert cache.fetch(prompts[2] + (0,)) is None and cache.fetch(prompts[3] + (0,)) is not None
