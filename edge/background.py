"""Background Responses' runs: work that outlives the request that started it (docs/apis.md, "Background responses").

Takes a submitted, accepted reply with its Responses stream protocol and the record the store keeps for it;
gives out its stream frames by sequence number, live or stored. Owns the runs of this process, in one task
group the app's lifespan starts (docs/STYLE.md, "One owner for the tree"): a run outlives its HTTP request
and ends when its reply does, when it is cancelled, or when the server stops.

A run reads its reply through the same protocol a streamed request writes out, keeps every frame in memory
for the readers that follow it, and saves the frames to the Responses store in batches (`SAVE_EVERY`,
`SAVE_SECONDS`), never one write a token. The record is stored again only when the status changes:
`queued` (by the route), `in_progress` at the first output, then the protocol's final response. Frames are
saved before the record that ends them, so a reader that finds a finished record in the store has every
frame already.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from functools import partial

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup, TaskStatus

from edge.store import store_call
from pipeline.errors import ErrorKind, RequestError
from stages.messages import Reply
from store.response_store import ResponseStore, StoredEvent, StoredResponse, unfinished
from wire.responses import ResponsesStream
from wire.sse import comment

log = structlog.get_logger(stage="background")

# Frames a run holds unsaved at most, and seconds: a reader in another process lags by at most this much.
SAVE_EVERY = 64
SAVE_SECONDS = 0.5
# How often a reader of a run in another process looks at the store for more frames.
POLL_SECONDS = 0.25
# A stopping server's last write for a run it cuts: shielded, and bounded (docs/STYLE.md, "Cleanup in
# cancelled tasks").
LAST_SAVE_SECONDS = 5.0
# Why work that was running when the server stopped ended as it did; also the start-up sweep's reason.
STOPPED = "The server stopped before this background response finished; it was not resumed."
# The `sequence_number` of a frame: the first one in its data is the event's own (its response object has none).
_SEQUENCE = re.compile(rb'"sequence_number":\s*(\d+)')


@attrs.define(eq=False)
class Run:
    """One background response in this process: its reply, its protocol and every frame so far."""

    record: StoredResponse
    reply: Reply
    protocol: ResponsesStream
    frames: list[StoredEvent] = attrs.field(factory=list)
    unsaved: list[StoredEvent] = attrs.field(factory=list)
    saved_at: float = attrs.field(factory=time.monotonic)
    # Its row has produced output: the response is `in_progress`.
    started: bool = False
    # Asked to stop (cancel) or to be forgotten (delete): the reply is closed, and a deleted run saves nothing.
    deleted: bool = False
    ended: anyio.Event = attrs.field(factory=anyio.Event)
    _changed: anyio.Event = attrs.field(factory=anyio.Event)

    @property
    def id(self) -> str:
        return self.record.id

    def add(self, chunk: bytes) -> None:
        """Takes the frames the protocol wrote; keepalive comments, which have no number, are dropped."""
        for frame in chunk.split(b"\n\n"):
            number = _SEQUENCE.search(frame)
            if number is not None:
                event = (int(number.group(1)), (frame + b"\n\n").decode())
                self.frames.append(event)
                self.unsaved.append(event)
        self._changed.set()
        self._changed = anyio.Event()

    def due(self) -> bool:
        return len(self.unsaved) >= SAVE_EVERY or (
            bool(self.unsaved) and time.monotonic() - self.saved_at > SAVE_SECONDS
        )

    def cancel(self, *, delete: bool = False) -> None:
        """Stops the row at its next step (the reply's abort hook); synchronous, so safe anywhere."""
        self.deleted = self.deleted or delete
        self.reply.close()

    async def follow(self, after: int, keepalive: float) -> AsyncIterator[bytes]:
        """The frames numbered above `after`, then each new one until the run ends; a keepalive when quiet."""
        position = sum(1 for number, _ in self.frames if number <= after)
        while True:
            while position < len(self.frames):
                position += 1
                yield self.frames[position - 1][1].encode()
            if self.ended.is_set():
                return
            changed = self._changed
            with anyio.move_on_after(keepalive):
                await changed.wait()
            if not changed.is_set():
                yield comment("keepalive")

    def end(self) -> None:
        self.ended.set()
        self._changed.set()


@attrs.define(eq=False)
class BackgroundRuns:
    """The background runs of this process, in a task group of the app's lifespan."""

    store: ResponseStore
    keepalive: float
    _group: TaskGroup | None = attrs.field(default=None, init=False)
    _runs: dict[str, Run] = attrs.field(factory=dict, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Marks what a previous server left unfinished `failed`, then holds the runs until cancelled."""
        try:
            swept = await store_call(self.store, lambda store: store.fail_unfinished(STOPPED))
        except RequestError:
            swept = 0  # logged by store_call; the server still serves
        if swept:
            log.warning("background.failed_at_start", responses=swept)
        async with anyio.create_task_group() as group:
            self._group = group
            task_status.started()
            await anyio.sleep_forever()

    def running(self, response_id: str) -> Run | None:
        return self._runs.get(response_id)

    async def begin(self, run: Run) -> None:
        """Stores the run `queued` with its first frames, then starts it in the lifespan's task group.

        Raises:
            RequestError: the store failed (nothing runs; the reply is closed).
        """
        assert self._group is not None, "the lifespan starts BackgroundRuns before the routes serve"
        try:
            await self._save(run, record=True)
        except BaseException:
            run.reply.close()
            raise
        self._runs[run.id] = run
        self._group.start_soon(self._drive, run)

    async def frames_after(self, response_id: str, after: int) -> AsyncIterator[bytes]:
        """Every frame numbered above `after`, then the new ones until the response ends, wherever it runs."""
        run = self._runs.get(response_id)
        if run is not None:
            async for frame in run.follow(after, self.keepalive):
                yield frame
            return
        while True:
            # The status first: a finished record's frames were all saved before it (the module's docstring).
            stored, events = await store_call(
                self.store, partial(_status_then_events, response_id=response_id, after=after)
            )
            for number, text in events:
                after = number
                yield text.encode()
            if stored is None or not unfinished(stored):
                return
            await anyio.sleep(POLL_SECONDS)

    async def _drive(self, run: Run) -> None:
        try:
            await self._outcome(run)
            await self._saved(run, record=True)
        finally:
            del self._runs[run.id]
            run.end()

    async def _outcome(self, run: Run) -> None:
        """Reads the reply to its end; a failure or a stopping server ends the protocol `failed`."""
        try:
            await self._read(run)
        except RequestError as error:
            run.add(run.protocol.error(error))
        except anyio.get_cancelled_exc_class():
            run.add(run.protocol.error(RequestError(kind=ErrorKind.UNAVAILABLE, message=STOPPED)))
            with anyio.CancelScope(shield=True), anyio.move_on_after(LAST_SAVE_SECONDS):
                await self._saved(run, record=True)
            raise

    async def _read(self, run: Run) -> None:
        with run.reply:
            async for events in run.reply:
                if not run.started and events:
                    run.started = True
                    run.add(run.protocol.running())
                    await self._saved(run, record=True)
                run.add(run.protocol.add_events(events))
                if run.due():
                    await self._saved(run, record=False)
            if run.reply.closed:
                run.add(run.protocol.cancel())
            else:
                run.add(run.protocol.finish(run.reply.summary))

    async def _saved(self, run: Run, *, record: bool) -> None:
        """`_save`, with a store failure logged (by store_call) and the run going on: it fails no one else."""
        try:
            await self._save(run, record=record)
        except RequestError:
            log.error("background.not_saved", response_id=run.id)

    async def _save(self, run: Run, *, record: bool) -> None:
        if run.deleted:
            return
        events, run.unsaved, run.saved_at = run.unsaved, [], time.monotonic()
        body = run.protocol.final or run.protocol.snapshot("in_progress" if run.started else "queued")
        current = attrs.evolve(run.record, body=body)
        # Queued, the record comes first, as events need theirs; after, it comes last (the module's docstring).
        first = record and not run.started and run.protocol.final is None

        def write(store: ResponseStore) -> None:
            if first:
                store.put(current)
            if events:
                store.add_events(current.id, events)
            if record and not first:
                store.put(current)

        await store_call(self.store, write)


def _status_then_events(
    store: ResponseStore, *, response_id: str, after: int
) -> tuple[StoredResponse | None, list[StoredEvent]]:
    """One trip to the store's thread: the record, then the frames numbered above `after`."""
    return store.get(response_id), store.events_after(response_id, after)
