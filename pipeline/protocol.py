"""The seam between the sink's output and an API's bytes.

Each API in `wire/` implements `StreamProtocol` once; `app.py` picks the
implementation by route. A protocol does no I/O: it turns events into
bytes (streaming) or a JSON object (non-streaming).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pipeline.errors import RequestError
from pipeline.events import CompletionEvent, Summary
from pipeline.requests import JsonObject


class StreamProtocol(Protocol):
    def start(self) -> bytes: ...

    def add_events(self, events: Sequence[CompletionEvent]) -> bytes: ...

    def finish(self, summary: Summary) -> bytes: ...

    def keepalive(self) -> bytes:
        """A frame clients ignore, sent while no output comes (queue, prefill) so none sits in silence."""
        ...

    def error(self, error: RequestError) -> bytes:
        """The terminal frame for a stream that failed after it began."""
        ...

    def body(self, events: Sequence[CompletionEvent], summary: Summary) -> JsonObject:
        """The whole response, for a non-streaming request."""
        ...
