"""stages/cache/prompt.py: longest-prefix reuse, byte-capped eviction, sessions, spills and restores.

Entries hold real mlx-lm `KVCache` layers whose keys encode each position,
so a test can see exactly which positions a view kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from stages.cache.prompt import RESTORE_GAIN, PromptCache
from stages.cache.tier import (
    HOST_BYTES_PER_ENTRY,
    HOST_BYTES_PER_LAYER,
    HOST_BYTES_PER_TOKEN,
    DiskStatistics,
    Entry,
    Key,
)

LAYERS, HEADS, DIM = 2, 2, 4
# float32 keys and values of every layer: bytes one token costs.
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 4


def cost(tokens: int) -> int:
    """What an entry of `tokens` tokens costs the cache: its KV and the host objects that hold it (tier.Entry)."""
    return tokens * (TOKEN_BYTES + HOST_BYTES_PER_TOKEN) + HOST_BYTES_PER_ENTRY + LAYERS * HOST_BYTES_PER_LAYER


def kv(length: int, *, first: int = 0) -> list[Any]:
    """Per-layer caches whose key at position p is `first + p` everywhere."""
    layers = []
    for _ in range(LAYERS):
        layer = KVCache()
        positions = mx.arange(first, first + length, dtype=mx.float32).reshape(1, 1, length, 1)
        # Contiguous, as the batch's extract() makes them.
        layer.keys = mx.contiguous(mx.broadcast_to(positions, (1, HEADS, length, DIM)))
        layer.values = mx.contiguous(layer.keys + 0.5)
        layer.offset = length
        mx.eval(layer.keys, layer.values)
        layers.append(layer)
    return layers


def entry(tokens: Sequence[int], *, prompt_len: int | None = None, session: str | None = None) -> Entry:
    return Entry(tokens=tuple(tokens), cache=kv(len(tokens)), prompt_len=prompt_len or len(tokens), session=session)


def positions(cache: list[Any]) -> list[int]:
    return [int(p) for p in cache[0].keys[0, 0, :, 0].tolist()]


BASE = tuple(range(100, 140))  # 40 tokens


def test_miss_then_hit_on_a_longer_prompt() -> None:
    """A prompt that extends a stored entry reuses all of it and prefills only the rest."""
    cache = PromptCache(max_bytes=1 << 20)
    assert cache.fetch(BASE) is None
    cache.store(entry(BASE))
    hit = cache.fetch(BASE + (1, 2, 3))
    assert hit is not None and hit.tokens == len(BASE) and hit.source == BASE
    assert positions(hit.cache) == list(range(len(BASE)))
    assert attrs.asdict(cache.statistics()) | {"disk": None} == {
        "entries": 1,
        "bytes": cost(len(BASE)),
        "max_bytes": 1 << 20,
        "hits": 1,
        "misses": 1,
        "cached_tokens": len(BASE),
        "session_hits": 0,
        "session_misses": 0,
        "evictions": 0,
        "disk": None,
        "kv_bytes": len(BASE) * TOKEN_BYTES,
        "max_entries": 0,
    }


def test_diverging_prompt_reuses_the_shared_prefix_only() -> None:
    """A prompt that leaves a stored entry part-way reuses exactly the tokens they share."""
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(BASE))
    hit = cache.fetch(BASE[:25] + (7, 7, 7))
    assert hit is not None and hit.tokens == 25
    assert positions(hit.cache) == list(range(25))
    assert all(layer.offset == 25 and layer.values.shape[2] == 25 for layer in hit.cache)


def test_identical_prompt_leaves_one_token_to_prefill() -> None:
    """The batch needs at least one prompt token to compute the first logits."""
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(BASE))
    hit = cache.fetch(BASE)
    assert hit is not None and hit.tokens == len(BASE) - 1
    assert cache.fetch(BASE[:1]) is None


def test_a_view_never_changes_the_entry() -> None:
    """Writing into a fetched view (as a single-row cache would) leaves the stored arrays as they were."""
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(BASE))
    hit = cache.fetch(BASE + (1,))
    assert hit is not None
    layer = hit.cache[0]
    layer.update_and_fetch(mx.full((1, HEADS, 1, DIM), -1.0), mx.full((1, HEADS, 1, DIM), -1.0))
    again = cache.fetch(BASE + (1,))
    assert again is not None and positions(again.cache) == list(range(len(BASE)))


def test_the_longest_of_several_entries_wins() -> None:
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(BASE[:10] + (1,) * 20))
    cache.store(entry(BASE[:30] + (2,) * 5))
    hit = cache.fetch(BASE + (9,))
    assert hit is not None and hit.tokens == 30


def test_byte_cap_evicts_least_recently_used_first() -> None:
    """Past max_bytes the entry used longest ago goes; a fetch counts as a use."""
    cache = PromptCache(max_bytes=2 * cost(40))
    a, b, c = (tuple(range(k * 1000, k * 1000 + 40)) for k in (1, 2, 3))
    cache.store(entry(a))
    cache.store(entry(b))
    assert cache.fetch(a + (0,)) is not None  # a is now the most recently used
    cache.store(entry(c))
    stats = cache.statistics()
    assert (stats.entries, stats.bytes, stats.evictions) == (2, 2 * cost(40), 1)
    assert cache.fetch(b + (0,)) is None
    assert cache.fetch(a + (0,)) is not None and cache.fetch(c + (0,)) is not None


def test_an_entry_larger_than_the_cap_is_not_kept() -> None:
    cache = PromptCache(max_bytes=cost(10))
    cache.store(entry(BASE))
    assert cache.statistics().entries == 0 and cache.statistics().bytes == 0


def test_session_entries_outlive_entries_without_a_session() -> None:
    """Eviction takes every entry without a session before any entry of one."""
    cache = PromptCache(max_bytes=2 * cost(40))
    mine = tuple(range(1, 41))
    cache.store(entry(mine, session="s1"))
    for k in range(2, 6):
        cache.store(entry(tuple(range(k * 1000, k * 1000 + 40))))
    hit = cache.fetch(mine + (0,), session="s1")
    assert hit is not None and hit.tokens == 40
    assert cache.fetch((9, 9, 9), session="s2") is None
    stats = cache.statistics()
    assert (stats.session_hits, stats.session_misses) == (1, 1)


def test_sessions_off_treats_every_entry_alike() -> None:
    cache = PromptCache(max_bytes=2 * cost(40), sessions=False)
    mine = tuple(range(1, 41))
    cache.store(entry(mine, session="s1"))
    for k in range(2, 4):
        cache.store(entry(tuple(range(k * 1000, k * 1000 + 40))))
    assert cache.fetch(mine + (0,), session="s1") is None
    assert cache.statistics().session_misses == 0


def test_a_continued_conversation_replaces_its_previous_entry() -> None:
    """Turn 2 contains all of turn 1's prompt: turn 2's entry replaces turn 1's, whose tail nobody will send."""
    cache = PromptCache(max_bytes=1 << 20)
    turn1 = BASE + (50, 51, 52)  # the prompt, then what the model generated
    cache.store(entry(turn1, prompt_len=len(BASE)))
    turn2_prompt = BASE + (60, 61, 62, 63)  # the reply re-rendered differently, then a new user turn
    hit = cache.fetch(turn2_prompt)
    assert hit is not None and hit.continues and hit.tokens == len(BASE)
    cache.store(entry(turn2_prompt + (70,), prompt_len=len(turn2_prompt)), replaces=hit.source)
    assert cache.statistics().entries == 1


def test_a_shared_system_prompt_does_not_replace_the_other_conversation() -> None:
    cache = PromptCache(max_bytes=1 << 20)
    other = BASE + (50, 51)
    cache.store(entry(other, prompt_len=len(other)))
    hit = cache.fetch(BASE[:20] + (8, 8, 8))
    assert hit is not None and not hit.continues
    cache.store(entry(BASE[:20] + (8, 8, 8, 9)), replaces=hit.source if hit.continues else None)
    assert cache.statistics().entries == 2


def test_a_stored_prefix_of_a_new_entry_is_dropped() -> None:
    """Its KV is inside the new entry; keeping both would pay for it twice."""
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(BASE[:20]))
    cache.store(entry(BASE))
    stats = cache.statistics()
    assert (stats.entries, stats.bytes) == (1, cost(len(BASE)))


@attrs.define
class FakeLower:
    """A lower tier that remembers what it was given, filed by (adapter, tokens) as the disk tier files it."""

    files: dict[tuple[str | None, Key], Entry] = attrs.Factory(dict)
    spilled: list[Key] = attrs.Factory(list)
    restored: list[Key] = attrs.Factory(list)

    def longest(self, tokens: Sequence[int], adapter: str | None = None) -> tuple[Key, int] | None:
        mine = [key for space, key in self.files if space == adapter]
        best = max(mine, key=lambda key: _shared(key, tokens), default=None)
        return (best, _shared(best, tokens)) if best is not None and _shared(best, tokens) else None

    def restore(self, key: Key, adapter: str | None = None) -> Entry | None:
        self.restored.append(key)
        found = self.files[adapter, key]
        return Entry(tokens=key, cache=found.cache, prompt_len=found.prompt_len, adapter=adapter, on_disk=True)

    def spill(self, entry: Entry) -> None:
        self.spilled.append(entry.tokens)
        self.files[entry.adapter, entry.tokens] = entry

    def statistics(self) -> DiskStatistics:
        return DiskStatistics(
            entries=len(self.files),
            bytes=0,
            max_bytes=0,
            spills=len(self.spilled),
            spills_dropped=0,
            spills_unsupported=0,
            spill_errors=0,
            restores=len(self.restored),
            corrupt=0,
            last_restore_seconds=None,
            last_restore_at=None,
        )


def _shared(key: Key, tokens: Sequence[int]) -> int:
    n = 0
    while n < min(len(key), len(tokens)) and key[n] == tokens[n]:
        n += 1
    return n


def test_evicted_entries_spill_and_come_back_from_the_lower_tier() -> None:
    lower = FakeLower()
    cache = PromptCache(max_bytes=cost(100), lower=lower)
    a, b = tuple(range(1, 101)), tuple(range(1001, 1101))
    cache.store(entry(a))
    cache.store(entry(b))
    assert lower.spilled == [a]
    hit = cache.fetch(a + (0,), session="s")
    assert hit is not None and hit.tokens == 100 and positions(hit.cache) == list(range(100))
    assert lower.restored == [a]
    # b was evicted to make room for the restored a; a is on disk already, b goes down now.
    assert lower.spilled == [a, b]
    stats = cache.statistics()
    assert stats.disk is not None and stats.disk.restores == 1
    # The restored entry belongs to the session that asked for it: it outlives entries without one.
    cache.store(entry(tuple(range(2001, 2101))))
    assert cache.fetch(a + (1,), session="s") is not None and lower.restored == [a]


def test_a_restore_must_gain_enough_tokens_to_pay_for_itself() -> None:
    lower = FakeLower()
    cache = PromptCache(max_bytes=1 << 20, lower=lower)
    lower.files[None, BASE + (1,) * RESTORE_GAIN] = entry(BASE + (1,) * RESTORE_GAIN)
    cache.store(entry(BASE + (2,)))
    near = cache.fetch(BASE + (1,) * (RESTORE_GAIN - 1) + (3,))
    assert near is not None and near.tokens == len(BASE) and lower.restored == []
    far = cache.fetch(BASE + (1,) * RESTORE_GAIN + (3,))
    assert far is not None and far.tokens == len(BASE) + RESTORE_GAIN and len(lower.restored) == 1


def test_memory_is_preferred_when_it_shares_as_much() -> None:
    lower = FakeLower()
    cache = PromptCache(max_bytes=1 << 20, lower=lower)
    lower.files[None, BASE] = entry(BASE)
    cache.store(entry(BASE))
    assert cache.fetch(BASE + (1,)) is not None
    assert lower.restored == []


@pytest.mark.parametrize("evicted_on_disk", [True, False])
def test_an_entry_already_on_disk_is_not_written_again(evicted_on_disk: bool) -> None:
    lower = FakeLower()
    cache = PromptCache(max_bytes=cost(40), lower=lower)
    first = entry(tuple(range(1, 41)))
    first.on_disk = evicted_on_disk
    cache.store(first)
    cache.store(entry(tuple(range(1001, 1041))))
    assert lower.spilled == ([] if evicted_on_disk else [first.tokens])
