"""Which models stay in memory: pure decisions over the fleet's budget, with no I/O and no clock.

Each model holds its footprint (weights, KV budget, prefill working set
and prompt cache: what its own memory plan was given) from the moment it
starts loading until it has stopped. A model that does not fit beside the
resident ones is placed by evicting the least recently used models that
are neither pinned nor busy (a request in flight, a load under way); when
even that leaves too little room the request is refused, with a 503 and a
Retry-After, rather than loading into an out-of-memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen(kw_only=True)
class Resident:
    name: str
    bytes: int
    pinned: bool
    # A request in flight, or loading: it cannot be evicted now.
    busy: bool
    # When it was last used (any monotonic clock; only the order matters).
    last_used: float


@attrs.frozen(kw_only=True)
class Place:
    """Load the model after unloading `evict`, in order (empty: it fits as things are)."""

    evict: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Refuse:
    """The model cannot be placed now; `permanent` when no eviction could ever make room."""

    reason: str
    permanent: bool


def place(needed: int, *, budget: int, resident: Sequence[Resident]) -> Place | Refuse:
    """Where a model of `needed` bytes goes in a `budget` that `resident` models share."""
    free = budget - sum(model.bytes for model in resident)
    if needed <= free:
        return Place()
    held = sum(model.bytes for model in resident if model.pinned)
    if needed > budget - held:
        return Refuse(
            reason=f"it needs {_gib(needed)} and the budget is {_gib(budget)}"
            + (f", of which pinned models hold {_gib(held)}" if held else ""),
            permanent=True,
        )
    evict: list[str] = []
    for model in sorted(
        (model for model in resident if not model.pinned and not model.busy), key=lambda m: m.last_used
    ):
        if free >= needed:
            break
        evict.append(model.name)
        free += model.bytes
    if free >= needed:
        return Place(evict=tuple(evict))
    busy = sorted(model.name for model in resident if model.busy and not model.pinned)
    return Refuse(
        reason=f"it needs {_gib(needed)}, {_gib(free)} could be freed now, "
        f"and models in use hold the rest ({', '.join(busy)})",
        permanent=False,
    )


def expired(resident: Sequence[Resident], ttls: dict[str, float], now: float) -> list[str]:
    """The models idle past their time to live: unpinned, not busy, unused for `ttl` seconds."""
    return [
        model.name
        for model in resident
        if not model.pinned and not model.busy and model.name in ttls and now - model.last_used >= ttls[model.name]
    ]


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
