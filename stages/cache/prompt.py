"""Prompt (prefix) cache: the KV state of earlier requests, keyed by tokens.

An entry is the per-layer KV cache of one finished (or aborted) row and the
tokens it holds: its prompt and what it generated. A new prompt reuses the
entry that shares the longest prefix with it: the row starts from a view
of that entry cut to the shared prefix, and prefills only the rest.
Entries are never written after they are stored (a view slices them, and
mlx-lm's BatchKVCache copies what it merges), so one entry can seed many
rows in one batch.

Bounded in bytes (what an entry costs the process: its arrays and the
host objects that key and find it, `tier.Entry.nbytes`) and in entries,
evicted least-recently-used first, with two refinements:
- entries of a session (`prompt_cache_key`, `session_id`, the
  x-session-affinity header) are evicted only after every entry without one;
- when a request contains the whole prompt of the entry it started from, its
  conversation has moved on: its own entry replaces that one (as would an
  entry whose tokens are a strict prefix of the new one's).
Evicted entries go to the lower (disk) tier, if any, which writes them in
the background; a later fetch that the lower tier can serve better restores
from it.

Entries of a LoRA adapter (`Entry.adapter`) hold KV that adapter computed:
they live in a trie of their own and serve only rows of the same adapter.
The lower tier keeps the same separation: an adapter's evicted entries go
down under that adapter and come back only for its rows.

Used on the gateway's model thread only (docs/STYLE.md, "One model thread"); the statistics are plain
ints, safe to read from the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import attrs
from mlx_lm.models.cache import PromptTrie

from stages.cache.tier import DiskStatistics, Entry, Key, LowerTier, candidates
from stages.models.mlx_internals import cut_layer

# PromptTrie keeps one trie per model: the base model's, and one per adapter.
_MODEL = "served"
# An entry's place: its adapter's trie, and its tokens.
_Slot = tuple[str, Key]
# Restore from disk only for at least this many more tokens than memory has:
# reading and checking a file costs about as much as prefilling a few dozen
# tokens on a CPU.
RESTORE_GAIN = 64
# An entry, its cache cut to the prompt, and the tokens that cut holds.
_Found = tuple[Entry | None, list[Any] | None, int]


@attrs.frozen(kw_only=True)
class Hit:
    """A row's head start: `cache` holds the KV of the prompt's first `tokens` tokens."""

    cache: list[Any]
    tokens: int
    source: Key
    # The prompt contains the source entry's whole prompt: the same conversation, one turn on.
    continues: bool


@attrs.frozen(kw_only=True)
class PromptCacheStatistics:
    entries: int
    # What the entries cost the process (arrays and host objects); `kv_bytes` is the arrays' part.
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    cached_tokens: int
    session_hits: int
    session_misses: int
    evictions: int
    disk: DiskStatistics | None = None
    kv_bytes: int = 0
    max_entries: int = 0


@attrs.define
class PromptCache:
    max_bytes: int
    sessions: bool = True
    lower: LowerTier | None = None
    # A bound on entries beside the bytes: each is Python objects the collector walks. 0: no bound.
    max_entries: int = 0
    _trie: PromptTrie = attrs.field(factory=PromptTrie, init=False)
    # Least recently used first; session entries in their own order.
    _plain: OrderedDict[_Slot, Entry] = attrs.field(factory=OrderedDict, init=False)
    _pinned: OrderedDict[_Slot, Entry] = attrs.field(factory=OrderedDict, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    _kv_bytes: int = attrs.field(default=0, init=False)
    _counts: dict[str, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        names = ("hits", "misses", "cached_tokens", "session_hits", "session_misses", "evictions")
        self._counts = dict.fromkeys(names, 0)

    def fetch(self, tokens: Sequence[int], *, session: str | None = None, adapter: str | None = None) -> Hit | None:
        """The longest usable cached prefix of `tokens`, leaving at least one token to prefill.

        The returned cache is a fresh view; the caller may hand it to the
        batch (which copies it) without changing the entry. An entry whose
        layers cannot be cut back (a sliding window past its size, a
        recurrent state) serves only prompts that contain all of it.
        """
        limit = len(tokens) - 1
        session = session if self.sessions else None
        entry, cache, shared = self._nearest(tokens, limit, _space(adapter))
        if self.lower is not None:
            entry, cache, shared = self._maybe_restore(tokens, limit, (entry, cache, shared), session, adapter)
        if entry is None or cache is None:
            self._count(hit=False, session=session)
            return None
        self._touch(_slot(entry))
        self._count(hit=True, session=session, tokens=shared)
        return Hit(cache=cache, tokens=shared, source=entry.tokens, continues=shared >= entry.prompt_len)

    def store(self, entry: Entry, *, replaces: Key | None = None) -> None:
        """Keep `entry`; drop `replaces` and any entry that is a prefix of it; evict to the cap."""
        if not entry.tokens or entry.kv_bytes == 0:
            return
        if not self.sessions:
            entry.session = None
        space = _space(entry.adapter)
        if replaces is not None and replaces != entry.tokens:
            self._drop((space, replaces))
        self._drop(_slot(entry))
        self._trie.add(space, list(entry.tokens), entry)
        # A prefix can be served by cutting this entry back, unless its layers
        # cannot be cut: then a prefix (a turn's checkpoint) stays useful.
        if _cut(entry, len(entry.tokens) - 1) is not None:
            for _, prefix in self._trie.pop_prefixes(space, list(entry.tokens)):
                self._forget(prefix)
        (self._pinned if entry.session else self._plain)[_slot(entry)] = entry
        self._bytes += entry.nbytes
        self._kv_bytes += entry.kv_bytes
        self._evict_to(self.max_bytes)

    def keys(self) -> set[Key]:
        """The base model's entries (what a sharded server mirrors; it serves no adapters)."""
        return {tokens for space, tokens in (*self._plain, *self._pinned) if space == _MODEL}

    def attach(self, lower: LowerTier) -> None:
        """Put `lower` (the disk tier) under this cache."""
        self.lower = lower

    def drop(self, key: Key, *, spill: bool = False) -> None:
        """Forget one of the base model's entries, if held (another rank decided to evict it, and to spill it)."""
        slot = (_MODEL, key)
        entry = self._plain.get(slot) or self._pinned.get(slot)
        if entry is not None and spill and self.lower is not None and not entry.on_disk:
            self.lower.spill(entry)
        self._drop(slot)

    def statistics(self) -> PromptCacheStatistics:
        return PromptCacheStatistics(
            entries=len(self._plain) + len(self._pinned),
            bytes=self._bytes,
            kv_bytes=self._kv_bytes,
            max_bytes=self.max_bytes,
            max_entries=self.max_entries,
            disk=self.lower.statistics() if self.lower is not None else None,
            **self._counts,
        )

    def _nearest(self, tokens: Sequence[int], limit: int, space: str) -> _Found:
        if limit <= 0 or not (self._plain or self._pinned):
            return None, None, 0
        for key, shared in candidates(self._trie, space, tokens[:limit]):
            entry = self._trie.get(space, list(key))
            cache = _cut(entry, shared)
            if cache is not None:
                return entry, cache, shared
        return None, None, 0

    def _maybe_restore(
        self, tokens: Sequence[int], limit: int, found: _Found, session: str | None, adapter: str | None
    ) -> _Found:
        assert self.lower is not None
        below = self.lower.longest(tokens, adapter)
        if below is None or min(below[1], limit) < found[2] + RESTORE_GAIN:
            return found
        restored = self.lower.restore(below[0], adapter)
        if restored is None or restored.adapter != adapter:
            return found
        # The session that asked for it owns it now; it is served from the
        # object in hand even if it is too large to keep.
        restored.session = session
        self.store(restored)
        shared = min(below[1], limit)
        cache = _cut(restored, shared)
        return (restored, cache, shared) if cache is not None else found

    def _touch(self, slot: _Slot) -> None:
        for order in (self._pinned, self._plain):
            if slot in order:
                order.move_to_end(slot)

    def _drop(self, slot: _Slot) -> None:
        if slot in self._plain or slot in self._pinned:
            self._trie.pop(slot[0], list(slot[1]))
            self._forget(self._plain.get(slot) or self._pinned[slot])

    def _forget(self, entry: Entry) -> None:
        slot = _slot(entry)
        (self._pinned if slot in self._pinned else self._plain).pop(slot)
        self._bytes -= entry.nbytes
        self._kv_bytes -= entry.kv_bytes

    def _evict_to(self, limit: int) -> None:
        while (self._plain or self._pinned) and (self._bytes > limit or self._over_entries()):
            slot, entry = (self._plain or self._pinned).popitem(last=False)
            self._trie.pop(slot[0], list(entry.tokens))
            self._bytes -= entry.nbytes
            self._kv_bytes -= entry.kv_bytes
            self._counts["evictions"] += 1
            if self.lower is not None and not entry.on_disk:
                self.lower.spill(entry)

    def _over_entries(self) -> bool:
        return 0 < self.max_entries < len(self._plain) + len(self._pinned)

    def _count(self, *, hit: bool, session: str | None, tokens: int = 0) -> None:
        self._counts["hits" if hit else "misses"] += 1
        self._counts["cached_tokens"] += tokens
        if session is not None:
            self._counts["session_hits" if hit else "session_misses"] += 1


def _space(adapter: str | None) -> str:
    return _MODEL if adapter is None else f"adapter:{adapter}"


def _slot(entry: Entry) -> _Slot:
    return _space(entry.adapter), entry.tokens


def _cut(entry: Entry, tokens: int) -> list[Any] | None:
    """The entry's cache cut to its first `tokens` positions, sharing its arrays; None if a layer cannot be."""
    held = len(entry.tokens)
    views = [cut_layer(layer, tokens, held) for layer in entry.cache]
    return None if tokens <= 0 or any(view is None for view in views) else views
