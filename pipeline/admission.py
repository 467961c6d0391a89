"""Admission: how many requests may be in the engine at once.

A request holds one ticket from `enter()` until its reply is done. The
bound is the batch plus the pending queue; a request that cannot get a
ticket within the admission timeout is refused with 429 (docs/STYLE.md, "Admission"), and once
the engine drains every new request gets 503.
"""

from __future__ import annotations

import anyio
import attrs

from pipeline.errors import overloaded, shutting_down


@attrs.frozen(kw_only=True)
class AdmissionStatistics:
    in_flight: int
    capacity: int
    refused: int
    draining: bool


@attrs.define
class Admission:
    _capacity: int = attrs.field(alias="capacity")
    _timeout: float = attrs.field(alias="timeout")
    _retry_after: float = attrs.field(alias="retry_after")
    _tickets: anyio.Semaphore = attrs.field(init=False)
    _idle: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _in_flight: int = attrs.field(default=0, init=False)
    _refused: int = attrs.field(default=0, init=False)
    _draining: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self._tickets = anyio.Semaphore(self._capacity)
        self._idle.set()

    async def enter(self) -> None:
        """Take a ticket, waiting at most the admission timeout.

        Raises:
            RequestError: 429 when the engine stays full, 503 while draining.
        """
        if self._draining:
            raise shutting_down()
        # A free ticket is taken without a checkpoint, so a zero timeout still admits.
        try:
            self._tickets.acquire_nowait()
        except anyio.WouldBlock:
            await self._wait_for_ticket()
        self._take()

    async def _wait_for_ticket(self) -> None:
        with anyio.move_on_after(self._timeout):
            await self._tickets.acquire()
            return
        self._refused += 1
        raise overloaded(self._retry_after)

    def leave(self) -> None:
        self._in_flight -= 1
        self._tickets.release()
        if self._in_flight == 0:
            self._idle.set()

    def start_draining(self) -> None:
        self._draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request holds a ticket; False if the timeout ran out."""
        if self._in_flight == 0:
            return True  # without a checkpoint, which a zero timeout would cancel
        with anyio.move_on_after(timeout):
            await self._idle.wait()
            return True
        return False

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(
            in_flight=self._in_flight, capacity=self._capacity, refused=self._refused, draining=self._draining
        )

    def _take(self) -> None:
        if self._draining:
            self._tickets.release()
            raise shutting_down()
        self._in_flight += 1
        if self._in_flight == 1:
            self._idle = anyio.Event()
