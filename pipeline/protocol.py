"""The seam between the sink's output and an API's bytes.

Each API in `wire/` implements `StreamProtocol` once; the edge's routes pick the implementation. A protocol
does no I/O: it turns events into bytes (streaming) or a JSON object (non-streaming). `Framing` is the
streaming half alone, over any frame type: `edge/streaming.py` runs one stream loop for all of them, SSE
bytes for HTTP and, for the Responses WebSocket, the stream's `StreamEvent`s, each sent as one text frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, TypeVar

from pipeline.errors import RequestError
from pipeline.events import CompletionEvent, Summary
from pipeline.requests import JsonObject

F_co = TypeVar("F_co", covariant=True)


class StreamEvent(NamedTuple):
    """One event of a stream before a transport frames it: its name, and its data as compact JSON text.

    SSE writes it as `event:` and `data:` lines (wire/sse.py's `sse`); the Responses WebSocket sends `data`
    as one text frame, as it is. A named tuple, not an attrs class: one is made per streamed token, and a
    tuple is the cheapest immutable record to make.
    """

    name: str
    data: str


class Framing(Protocol[F_co]):
    """A stream's frames, of one type: what `edge/streaming.py`'s loop writes out."""

    def start(self) -> F_co: ...

    def add_events(self, events: Sequence[CompletionEvent]) -> F_co: ...

    def finish(self, summary: Summary) -> F_co: ...

    def keepalive(self) -> F_co:
        """A frame clients ignore, sent while no output comes (queue, prefill) so none sits in silence."""
        ...

    def error(self, error: RequestError) -> F_co:
        """The terminal frame for a stream that failed after it began."""
        ...


class StreamProtocol(Framing[bytes], Protocol):
    def body(self, events: Sequence[CompletionEvent], summary: Summary) -> JsonObject:
        """The whole response, for a non-streaming request."""
        ...
