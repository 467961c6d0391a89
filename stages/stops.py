"""Stop strings matched on decoded text, across token boundaries.

The matcher holds back only text that could still become a stop string
(the longest suffix that is a prefix of one), so no part of a stop string
is ever streamed and ordinary text is not delayed. The markup splitter
(`stages/reply/markup.py`) and the families' splitters and readers
(`stages/families/`) hold back their markers with the same functions
(`hold_back`, `partial_suffix`), so this lives at the root of `stages/`,
below both rooms: neither imports the other for it. Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


@attrs.frozen(kw_only=True)
class StopResult:
    text: str
    stop: str | None = None


@attrs.define
class StopMatcher:
    _stops: tuple[str, ...] = attrs.field(alias="stops")
    _held: str = attrs.field(default="", init=False)

    def feed(self, text: str, *, final: bool = False) -> StopResult:
        """Text safe to emit now, and the stop string if one was completed.

        After a stop is found, the text after it is discarded. With
        `final`, nothing is held back.
        """
        if not self._stops:
            # Nothing to find or hold back (most requests): the text as it came.
            return StopResult(text=text)
        buffer = self._held + text
        found = earliest(buffer, self._stops)
        if found is not None:
            index, stop = found
            self._held = ""
            return StopResult(text=buffer[:index], stop=stop)
        ready, self._held = hold_back(buffer, self._stops, final=final)
        return StopResult(text=ready)


def earliest(buffer: str, needles: Sequence[str]) -> tuple[int, str] | None:
    """Where the first of `needles` starts in `buffer`, and which one; None if none does."""
    return min(((buffer.find(needle), needle) for needle in needles if needle in buffer), default=None)


def hold_back(buffer: str, needles: Sequence[str], *, final: bool) -> tuple[str, str]:
    """`buffer` split into the text safe to emit now and the end that could still grow into a needle.

    With `final` nothing can grow any more, so nothing is held.
    """
    keep = 0 if final else partial_suffix(buffer, needles)
    return buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]


def partial_suffix(buffer: str, needles: Sequence[str]) -> int:
    """The length of the longest end of `buffer` that could still grow into one of `needles`."""
    longest = 0
    for needle in needles:
        for size in range(min(len(needle) - 1, len(buffer)), longest, -1):
            if buffer.endswith(needle[:size]):
                longest = size
                break
    return longest
