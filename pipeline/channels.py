"""Bounded channels between stages, and the per-request reply slot.

Every channel in the engine is made by `open_channel` with an explicit,
finite bound (docs/STYLE.md, "Bounded channels"). The reply path is different: the sink must never wait
on a slow client, so each request gets a `ReplySlot`, a single slot whose
`put()` never blocks and merges events while the reader is behind
(vLLM's `RequestOutputCollector`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

import anyio
import attrs
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.errors import RequestError
from pipeline.events import CompletionEvent, Summary

T = TypeVar("T")
R = TypeVar("R")


@attrs.frozen
class Channel(Generic[T]):
    name: str
    send: MemoryObjectSendStream[T]
    receive: MemoryObjectReceiveStream[T]


def open_channel(capacity: int, *, name: str) -> Channel[T]:
    """A bounded memory channel.

    Raises:
        ValueError: the capacity is negative or infinite.
    """
    if capacity < 0 or math.isinf(capacity):
        raise ValueError(f"channel {name!r} needs a finite, non-negative bound")
    send, receive = anyio.create_memory_object_stream[T](capacity)
    return Channel(name, send, receive)


class ReplyClosed(Exception):
    """The reader closed the reply (its client went away) before the request was accepted."""


@attrs.define(eq=False)
class ReplySlot(Generic[R]):
    """One request's reply: accepted request, events, then a summary or error.

    Producers (the stages, on the event loop) call `accept`, `put`,
    `finish` and `fail`; each returns False once the slot is done, which
    tells the producer to drop the request. The reader awaits `accepted()`,
    iterates event batches, then reads `summary`. `close()` is synchronous
    so that it is safe in a cancelled task (docs/STYLE.md, "Cleanup in cancelled tasks"); if a row is running,
    `close()` and `fail()` call the abort hook the gateway bound with
    `bind_abort`.
    """

    request_id: str
    # The client's id for its request (x-request-id), else the request id.
    trace_id: str = ""
    # Prompt tokens the prompt cache held, set when the row is admitted (Anthropic's message_start reports them).
    cached_tokens: int | None = attrs.field(default=None, init=False)
    _on_done: Callable[[], None] = attrs.field(default=lambda: None, alias="on_done")
    _request: R | None = attrs.field(default=None, init=False)
    _events: list[CompletionEvent] = attrs.field(factory=list, init=False)
    _summary: Summary | None = attrs.field(default=None, init=False)
    _error: RequestError | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _abort: Callable[[], None] | None = attrs.field(default=None, init=False)
    # The reader's wake-up while it waits, made per wait: one per streamed chunk.
    _waiter: asyncio.Event | anyio.Event | None = attrs.field(default=None, init=False)
    # Batches the reader has taken: a keepalive clock reads a reply as quiet while this stays put.
    _taken: int = attrs.field(default=0, init=False)
    # The reader is owed an empty batch: its keepalive is due (edge/keepalive.py).
    _nudged: bool = attrs.field(default=False, init=False)

    @property
    def log_context(self) -> dict[str, str]:
        """The ids every stage's log line for this request carries."""
        return {"request_id": self.request_id, "trace_id": self.trace_id or self.request_id}

    @property
    def done(self) -> bool:
        return self._closed or self._summary is not None or self._error is not None

    @property
    def closed(self) -> bool:
        """The reader has gone away: stages skip this request."""
        return self._closed

    @property
    def summary(self) -> Summary:
        if self._summary is None:
            raise RuntimeError("the reply has not finished")
        return self._summary

    def accept(self, request: R) -> bool:
        if self.done:
            return False
        self._request = request
        self._wake()
        return True

    def bind_abort(self, abort: Callable[[], None]) -> None:
        self._abort = abort

    def put(self, events: list[CompletionEvent]) -> bool:
        if self.done:
            return False
        self._events.extend(events)
        self._wake()
        return True

    def finish(self, summary: Summary) -> bool:
        if self.done:
            return False
        self._summary = summary
        self._settle()
        return True

    def fail(self, error: RequestError) -> bool:
        if self.done:
            return False
        self._error = error
        # A failed row leaves the batch as a closed one does.
        if self._abort is not None:
            self._abort()
        self._settle()
        return True

    def close(self) -> None:
        if self.done:
            return
        self._closed = True
        if self._abort is not None:
            self._abort()
        self._settle()

    async def accepted(self) -> R:
        """Wait until a stage accepts the request.

        Raises:
            RequestError: the request failed before it was accepted.
            ReplyClosed: the reader closed the reply first.
        """
        while self._request is None:
            self._raise_if_failed()
            if self.done:
                raise ReplyClosed(self.request_id)
            await self._wait()
        return self._request

    def __aiter__(self) -> ReplySlot[R]:
        return self

    async def __anext__(self) -> list[CompletionEvent]:
        """The next batch of events; an empty one when `nudge` woke the reader with nothing to read."""
        while not self._events:
            self._raise_if_failed()
            if self.done:
                raise StopAsyncIteration
            if self._nudged:
                self._nudged = False
                return []
            await self._wait()
        return self.take_ready()

    def take_ready(self) -> list[CompletionEvent]:
        """The events waiting now, without waiting; `__anext__` still says when the reply ends."""
        events, self._events = self._events, []
        if events:
            self._taken += 1
            self._nudged = False
        return events

    @property
    def taken(self) -> int:
        """How many batches the reader has taken so far."""
        return self._taken

    def nudge(self) -> None:
        """Wake the reader with an empty batch if it has nothing to read: it has been quiet too long."""
        self._nudged = True
        self._wake()

    def __enter__(self) -> ReplySlot[R]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    async def _wait(self) -> None:
        # The reader checked for news just before, and nothing runs between that and here: a wake cannot be missed.
        self._waiter = waiter = _new_event()
        try:
            await waiter.wait()
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None:
            self._waiter.set()

    def _settle(self) -> None:
        self._wake()
        on_done, self._on_done = self._on_done, lambda: None
        on_done()


def _new_event() -> asyncio.Event | anyio.Event:
    """asyncio's own event on asyncio: anyio's costs 3 µs to make against asyncio's 0.3 (anyio asks which library
    runs, then wraps asyncio's), and the front makes one per streamed chunk. anyio's elsewhere (trio)."""
    return asyncio.Event() if sniffio.current_async_library() == "asyncio" else anyio.Event()


def drain_nowait(stream: MemoryObjectReceiveStream[T], *, limit: int | None) -> list[T]:
    """What `stream` holds now, at most `limit` items, without waiting."""
    items: list[T] = []
    while limit is None or len(items) < limit:
        try:
            items.append(stream.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            break
    return items
