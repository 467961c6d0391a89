"""The prompt cache over caches that cannot always be cut back, with mlx-lm's own cache classes.

A sliding-window layer past its window (`RotatingKVCache`) and a recurrent
layer (`ArraysCache`) hold a state for exactly their tokens: an entry of
them serves only a prompt that contains all of it, and storing it keeps the
shorter entries (a turn's checkpoint) that a diverging prompt still needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from stages.cache.disk import DiskTier, SpillJob
from stages.cache.link import DiskLink
from stages.cache.prompt import PromptCache
from stages.cache.tier import Entry

WINDOW = 8


def plain(tokens: int) -> Any:
    layer = KVCache()
    layer.update_and_fetch(mx.ones((1, 1, tokens, 4)), mx.ones((1, 1, tokens, 4)))
    return layer


def rotating(tokens: int) -> Any:
    layer = RotatingKVCache(max_size=WINDOW)
    layer.update_and_fetch(mx.ones((1, 1, tokens, 4)), mx.ones((1, 1, tokens, 4)))
    return layer


def recurrent(tokens: int) -> Any:
    layer = ArraysCache(size=2)
    layer[0], layer[1] = mx.full((1, 3), float(tokens)), mx.ones((1, 2, 2))
    return layer


def entry(tokens: tuple[int, ...], *layers: Any, prompt_len: int | None = None) -> Entry:
    return Entry(tokens=tokens, cache=list(layers), prompt_len=prompt_len or len(tokens))


TURN = tuple(range(100, 112))  # 12 tokens: past the window


def test_a_recurrent_entry_serves_a_prompt_that_contains_it_whole() -> None:
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(TURN, recurrent(12), plain(12)))
    hit = cache.fetch(TURN + (5, 6))
    assert hit is not None and hit.tokens == 12 and hit.source == TURN
    assert [type(layer) for layer in hit.cache] == [ArraysCache, KVCache]


def test_a_recurrent_entry_is_not_cut_to_a_shorter_prompt() -> None:
    """A prompt that diverges inside the entry (or equals it: one token must stay to prefill) misses."""
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(TURN, recurrent(12), plain(12)))
    assert cache.fetch(TURN[:8] + (1, 2, 3)) is None
    assert cache.fetch(TURN) is None
    assert cache.statistics().misses == 2


def test_the_checkpoint_serves_what_the_longer_entry_cannot() -> None:
    """Turn boundary: the prompt's state stays beside the answer's, for a next turn that re-renders the answer."""
    cache = PromptCache(max_bytes=1 << 20)
    checkpoint, answered = TURN[:10], TURN + (7, 8, 9)
    cache.store(entry(checkpoint, recurrent(10), plain(10)))
    cache.store(entry(answered, recurrent(15), plain(15), prompt_len=10))
    assert cache.statistics().entries == 2
    # The client sends the answer back tokenized differently: only the checkpoint is a prefix.
    hit = cache.fetch(checkpoint + (42, 43, 44))
    assert hit is not None and hit.source == checkpoint and hit.tokens == 10
    # Sent back exactly: the whole answered entry is.
    hit = cache.fetch(answered + (1,))
    assert hit is not None and hit.source == answered and hit.tokens == 15


def test_a_plain_entry_still_replaces_its_prefixes_and_is_cut() -> None:
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(entry(TURN[:10], plain(10)))
    cache.store(entry(TURN, plain(12)))
    assert cache.statistics().entries == 1
    hit = cache.fetch(TURN[:6] + (1, 2))
    assert hit is not None and hit.tokens == 6 and hit.cache[0].offset == 6


def test_a_sliding_window_entry_is_cut_inside_its_window_only() -> None:
    cache = PromptCache(max_bytes=1 << 20)
    short, long = TURN[:6], tuple(range(300, 312))
    cache.store(entry(short, rotating(6), plain(6)))
    cache.store(entry(long, rotating(12), plain(12)))
    inside = cache.fetch(short[:4] + (1, 2))
    assert inside is not None and inside.tokens == 4 and inside.cache[0].offset == 4
    assert cache.fetch(long[:10] + (1, 2)) is None  # past the window: cannot be cut back
    whole = cache.fetch(long + (1,))
    assert whole is not None and whole.tokens == 12


def test_views_never_change_the_entry() -> None:
    cache = PromptCache(max_bytes=1 << 20)
    stored = entry(TURN[:6], rotating(6), plain(6))
    cache.store(stored)
    hit = cache.fetch(TURN[:3] + (1,))
    assert hit is not None
    assert [layer.offset for layer in stored.cache] == [6, 6]


def test_the_disk_tier_skips_what_its_format_cannot_hold_and_counts_it(tmp_path: Path) -> None:
    disk = DiskTier(root=tmp_path, max_bytes=1 << 20, fingerprint="f")
    disk.scan()
    outbox: list[SpillJob] = []
    link = DiskLink(disk, outbox, lambda keys, values: None)
    link.spill(entry(TURN, recurrent(12), plain(12)))
    link.spill(entry(TURN[:6], rotating(6), plain(6)))
    assert outbox == [] and disk.statistics().spills_unsupported == 2
    link.spill(entry(TURN[:4], plain(4)))
    assert len(outbox) == 1
