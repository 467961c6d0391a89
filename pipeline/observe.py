"""What the sink tells the metrics about each request, free of any metrics library.

The sink holds each row's timeline, so it is where a request's latencies
are known; the exporter (`edge/metrics.py`) sits above every layer. This
seam keeps the sink from importing it: the engine hands the sink an
observer, and the default one does nothing.
"""

from __future__ import annotations

from typing import Protocol

import attrs


@attrs.frozen(kw_only=True)
class RequestRecord:
    """One request that left the batch. Spans are seconds; None where the
    request never reached that point (a row aborted before its first token)."""

    request_id: str
    # vLLM's `finished_reason` values: stop, length, abort.
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue: float | None
    prefill: float | None
    decode: float | None
    # Received → first token, and received → finished.
    first_token: float | None
    total: float | None


class RequestObserver(Protocol):
    def token_gap(self, seconds: float) -> None:
        """The time between two tokens of one row (called once per token after the first)."""

    def finished(self, record: RequestRecord) -> None: ...


@attrs.frozen
class Observers:
    """Tells each of several observers (the metrics, the traces)."""

    observers: tuple[RequestObserver, ...]

    def token_gap(self, seconds: float) -> None:
        for observer in self.observers:
            observer.token_gap(seconds)

    def finished(self, record: RequestRecord) -> None:
        for observer in self.observers:
            observer.finished(record)


class NullObserver:
    def token_gap(self, seconds: float) -> None:
        pass

    def finished(self, record: RequestRecord) -> None:
        pass
