"""stages/cache/prompt.py: entries of one LoRA adapter never serve another, nor the base model."""

from __future__ import annotations

from stages.cache.prompt import PromptCache
from stages.cache.tier import Entry
from tests.stages.cache.test_prompt_cache import BASE, FakeLower, cost, kv, positions


def adapted(tokens: tuple[int, ...], adapter: str | None, *, first: int = 0) -> Entry:
    return Entry(tokens=tokens, cache=kv(len(tokens), first=first), prompt_len=len(tokens), adapter=adapter)


def test_an_adapter_entry_serves_only_its_adapter() -> None:
    """The same tokens under two adapters and the base are three entries; each fetch finds its own."""
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(adapted(BASE, "a", first=1000))
    assert cache.fetch(BASE + (1,)) is None
    assert cache.fetch(BASE + (1,), adapter="b") is None
    cache.store(adapted(BASE, None, first=0))
    cache.store(adapted(BASE, "b", first=2000))
    for adapter, first in ((None, 0), ("a", 1000), ("b", 2000)):
        hit = cache.fetch(BASE + (1,), adapter=adapter)
        assert hit is not None and hit.tokens == len(BASE)
        assert positions(hit.cache) == list(range(first, first + len(BASE)))
    assert cache.statistics().entries == 3


def test_replacing_and_prefix_dropping_stay_within_an_adapter() -> None:
    """A longer entry of adapter a drops a's prefix entry, never the base model's."""
    cache = PromptCache(max_bytes=1 << 20)
    cache.store(adapted(BASE, None))
    cache.store(adapted(BASE, "a", first=1000))
    cache.store(adapted(BASE + (7, 8), "a", first=1000), replaces=BASE)
    base = cache.fetch(BASE + (9,))
    assert base is not None and positions(base.cache) == list(range(len(BASE)))
    assert cache.statistics().entries == 2


def test_an_adapter_entry_goes_down_under_its_adapter_and_comes_back_only_for_it() -> None:
    """Evicted, an adapter's entry is spilled with its adapter; the lower tier then serves it to that adapter's rows
    only."""
    lower = FakeLower()
    cache = PromptCache(max_bytes=cost(100), lower=lower)
    a, b, c = tuple(range(1, 101)), tuple(range(1001, 1101)), tuple(range(2001, 2101))
    cache.store(adapted(a, "x", first=1000))
    cache.store(adapted(b, None))
    cache.store(adapted(c, None))
    assert lower.spilled == [a, b] and set(lower.files) == {("x", a), (None, b)}
    assert cache.fetch(a + (0,)) is None and cache.fetch(a + (0,), adapter="y") is None and lower.restored == []
    hit = cache.fetch(a + (0,), adapter="x")
    assert hit is not None and lower.restored == [a] and positions(hit.cache) == list(range(1000, 1100))
    assert cache.fetch(b + (0,), adapter="x") is None and lower.restored == [a]
