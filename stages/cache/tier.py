"""What the memory tier and a lower (disk) tier share: keys, prefix search, the lower tier's interface.

Both tiers import this module and neither imports the other's internals, so
the disk tier can be read and tested without the memory tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs
from mlx_lm.models.cache import PromptTrie

Key = tuple[int, ...]

# What an entry costs the process beyond its arrays' bytes, so that the
# cache's cap bounds the process and not only the KV: measured with
# tracemalloc on CPython 3.11 (tests/stages/cache/test_prompt_cache_memory.py
# checks the figures still cover it). Per token, the key tuple's slot and
# its int, and the PromptTrie's dict node for it (about 264 bytes; nodes a
# prefix shares are counted once per entry, so this errs high). Per entry,
# the Entry and its list; per layer, the cache object and its two arrays'
# Python wrappers.
HOST_BYTES_PER_TOKEN = 272
HOST_BYTES_PER_ENTRY = 1024
HOST_BYTES_PER_LAYER = 768


@attrs.define(eq=False)
class Entry:
    tokens: Key
    cache: list[Any]
    prompt_len: int
    session: str | None = None
    # The adapter whose KV this is (None: the base model's): entries of one never serve another.
    adapter: str | None = None
    # A copy is already on disk: evicting this one needs no new write.
    on_disk: bool = False
    # The arrays' bytes (mlx-lm's `nbytes`: a KVCache's whole allocated buffer, not just its filled part).
    kv_bytes: int = attrs.field(init=False)
    # What the entry costs the process: the arrays and the host objects that hold and find them.
    nbytes: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.kv_bytes = sum(int(layer.nbytes) for layer in self.cache)
        host = HOST_BYTES_PER_ENTRY + HOST_BYTES_PER_LAYER * len(self.cache) + HOST_BYTES_PER_TOKEN * len(self.tokens)
        self.nbytes = self.kv_bytes + host


@attrs.frozen(kw_only=True)
class DiskStatistics:
    entries: int
    bytes: int
    max_bytes: int
    spills: int
    spills_dropped: int
    spill_errors: int
    # Entries not written because the file format takes only plain KV (a
    # sliding-window or recurrent layer, or a dtype it has no name for).
    spills_unsupported: int
    restores: int
    corrupt: int
    last_restore_seconds: float | None
    last_restore_at: float | None


class LowerTier(Protocol):
    """A slower tier under the memory one (the disk), as the cache uses it.

    An entry of one adapter (None: the base model) is found and restored for
    that adapter only; `spill` files it by `Entry.adapter`.
    """

    def longest(self, tokens: Sequence[int], adapter: str | None = None) -> tuple[Key, int] | None: ...

    def restore(self, key: Key, adapter: str | None = None) -> Entry | None: ...

    def spill(self, entry: Entry) -> None: ...

    def statistics(self) -> DiskStatistics: ...


def nearest(trie: PromptTrie, model: str, tokens: Sequence[int]) -> tuple[Key | None, int]:
    """The stored key sharing the longest prefix with `tokens`, and how many tokens it shares.

    Either a stored prefix of `tokens`, or a key that shares its first
    `common_prefix` tokens and then goes on differently: whichever shares more.
    """
    found = trie.search(model, list(tokens))
    if found.exact is not None:
        return tuple(found.exact), len(tokens)
    best, shared = None, 0
    if found.shorter:
        best, shared = found.shorter, len(found.shorter)
    if found.longer and found.common_prefix > shared:
        best, shared = found.longer, found.common_prefix
    return (tuple(best), shared) if best else (None, 0)


def candidates(trie: PromptTrie, model: str, tokens: Sequence[int]) -> list[tuple[Key, int]]:
    """Stored keys that share a prefix with `tokens`, and how much, most shared first.

    The best may be one that goes on differently after the shared tokens,
    usable only by a cache that can be cut back; the longest stored prefix
    of `tokens` follows it, usable by any cache as it is.
    """
    found = trie.search(model, list(tokens))
    if found.exact is not None:
        return [(tuple(found.exact), len(tokens))]
    ranked = []
    # On a tie the stored prefix comes first: it needs no cutting.
    if found.shorter:
        ranked.append((tuple(found.shorter), len(found.shorter)))
    if found.longer and found.common_prefix > 0:
        ranked.append((tuple(found.longer), found.common_prefix))
    return sorted(ranked, key=lambda pair: -pair[1])
