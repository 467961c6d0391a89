"""Stop strings matched on decoded text, across token boundaries.

The matcher holds back only text that could still become a stop string
(the longest suffix that is a prefix of one), so no part of a stop string
is ever streamed and ordinary text is not delayed. Pure; no I/O.
"""

from __future__ import annotations

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
        buffer = self._held + text
        found = self._earliest_stop(buffer)
        if found is not None:
            index, stop = found
            self._held = ""
            return StopResult(text=buffer[:index], stop=stop)
        keep = 0 if final else self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return StopResult(text=buffer[: len(buffer) - keep])

    def _earliest_stop(self, buffer: str) -> tuple[int, str] | None:
        hits = [(buffer.find(stop), stop) for stop in self._stops if stop in buffer]
        return min(hits, default=None)

    def _partial_suffix(self, buffer: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
