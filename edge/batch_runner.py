"""The batch runner: every unfinished batch's lines sent through the app's own routes, beneath live traffic.

A task of the app's lifespan (docs/STYLE.md, "One owner for the tree"), the one owner of the running batches'
state; routes read it as snapshots. A line is sent only while fewer than `batch_live_limit` live requests are
admitted and at most `batch_rows` lines run at once, so the batch keeps room for a live request (docs/apis.md,
"Files and batches"). Each finished line is appended to the batch's results before it counts; at start the
runner reads them back and resumes every unfinished batch with the lines not yet done.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup, TaskStatus
from quart import Quart

from edge.batch_calls import LineResult, run_line
from fleet.fleet import Fleet
from pipeline.requests import JsonObject, JsonValue
from pipeline.settings import Settings
from stages.engine.engine import Engine
from store.batch_folders import ENDED, ERRORS, OUTPUT, BatchRecord, BatchStore
from store.files import FileStore
from store.opening import store_path
from wire.batches import BatchLine, expired_error, failed_line, line_refusal, output_line

log = structlog.get_logger(stage="batches")

# How often capacity is looked at while a batch has lines left: admission has no event to wait on, and a
# live request finishing frees room that the next look takes.
_POLL = 0.05


@attrs.frozen(kw_only=True)
class BatchProgress:
    id: str
    status: str
    total: int
    completed: int
    failed: int


@attrs.frozen(kw_only=True)
class BatchStatistics:
    """The runner's figures for `/stats` and `/metrics` (wire/metric_figures.py: the `lines_*` are counters)."""

    running: tuple[BatchProgress, ...]
    # Batches not yet ended: validating, in progress, finalizing or cancelling.
    in_progress: int
    rows_in_flight: int
    # Lines written since this process started: to the output (completed) and to the errors (failed).
    lines_completed: int
    lines_failed: int
    live_limit: int
    max_rows: int


# Statuses of a line that admission turned away while the server was busy with live work, and how long the
# batch then rests before sending again.
_BUSY = frozenset({429, 503})
_REST_S = 1.0


@attrs.define(eq=False)
class _Running:
    record: BatchRecord
    # The lines not yet done, in order; `next` is the first not yet sent.
    lines: list[BatchLine]
    next: int = 0
    in_flight: dict[str, anyio.Event] = attrs.field(factory=dict)
    # Lines sent and then cut short (cancel, window): an expired batch reports them with the unsent ones.
    cut: list[BatchLine] = attrs.field(factory=list)
    # time.time() before which no line is sent: the server refused one as busy (429, 503) and live work comes first.
    resting_until: float = 0.0
    # One save at a time, each writing the record as it is by then: a cancel's save and the runner's, both in
    # threads, could otherwise land in either order and leave the file behind the record.
    saving: anyio.Lock = attrs.field(factory=anyio.Lock)


@attrs.define(eq=False)
class BatchRunner:
    app: Quart
    # Whose engines' live requests the runner yields to.
    fleet: Fleet
    files: FileStore
    batches: BatchStore
    live_limit: int
    max_rows: int
    window: float
    temporary: bool = False
    _running: dict[str, _Running] = attrs.field(factory=dict, init=False)
    _wake: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _scope: anyio.CancelScope = attrs.field(factory=anyio.CancelScope, init=False)
    _rows: int = attrs.field(default=0, init=False)
    _completed: int = attrs.field(default=0, init=False)
    _failed: int = attrs.field(default=0, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                for record in await anyio.to_thread.run_sync(self.batches.listed):
                    if record.status not in ENDED:
                        await self._resume(record)
                async with anyio.create_task_group() as group:
                    task_status.started()
                    await self._serve(group)
        finally:
            if self.temporary:
                shutil.rmtree(self.files.folder.parent, ignore_errors=True)

    async def _serve(self, group: TaskGroup) -> None:
        while True:
            await self._tick(group)
            with anyio.move_on_after(_POLL if self._running else math.inf):
                await self._wake.wait()
            self._wake = anyio.Event()

    def stop(self) -> None:
        """End the running lines as dropped clients (they run again at the next start) and the runner with them."""
        for run in self._running.values():
            for abort in run.in_flight.values():
                abort.set()
        self._scope.cancel()

    async def create(
        self,
        *,
        api: str,
        endpoint: str,
        input_file_id: str,
        lines: list[BatchLine],
        metadata: dict[str, str] | None,
        owner: str | None,
    ) -> BatchRecord:
        """A new batch, `validating` until the runner takes it up."""
        now = int(time.time())
        prefix = "msgbatch_" if api == "anthropic" else "batch_"
        record = BatchRecord(
            id=f"{prefix}{uuid.uuid4().hex}",
            api=api,
            endpoint=endpoint,
            input_file_id=input_file_id,
            metadata=metadata,
            owner=owner,
            status="validating",
            created_at=now,
            expires_at=now + math.ceil(self.window),
            total=len(lines),
        )
        await anyio.to_thread.run_sync(self.batches.create, record, [line.as_json() for line in lines])
        self._running[record.id] = _Running(record=record, lines=lines)
        self._wake.set()
        return record

    async def cancel(self, batch_id: str) -> BatchRecord | None:
        """Start cancelling a running batch; an ended one is returned as it is."""
        run = self._running.get(batch_id)
        if run is None or run.record.status not in ("validating", "in_progress"):
            return self.record(batch_id) or await anyio.to_thread.run_sync(self.batches.get, batch_id)
        # What this call set: the runner may end the batch while the save is written, and the answer to a
        # cancel is "cancelling" then (OpenAI's), not a later status.
        cancelling = await self._save(run, status="cancelling", cancelling_at=int(time.time()))
        self._wake.set()
        return cancelling

    def record(self, batch_id: str) -> BatchRecord | None:
        """A running batch's current facts (fresher than its file), None when it is not running."""
        run = self._running.get(batch_id)
        return run.record if run is not None else None

    def statistics(self) -> BatchStatistics:
        running = tuple(
            BatchProgress(id=r.id, status=r.status, total=r.total, completed=r.completed, failed=r.failed)
            for r in (run.record for run in self._running.values())
        )
        return BatchStatistics(
            running=running,
            in_progress=len(running),
            rows_in_flight=self._rows,
            lines_completed=self._completed,
            lines_failed=self._failed,
            live_limit=self.live_limit,
            max_rows=self.max_rows,
        )

    async def _resume(self, record: BatchRecord) -> None:
        outputs = await anyio.to_thread.run_sync(self.batches.results, record.id, OUTPUT)
        errors = await anyio.to_thread.run_sync(self.batches.results, record.id, ERRORS)
        done = {str(line["custom_id"]) for line in outputs + errors}
        lines = [_line(raw) for raw in await anyio.to_thread.run_sync(self.batches.input_lines, record.id)]
        expired = sum(1 for line in errors if _code(line) == "batch_expired")
        counted = attrs.evolve(record, completed=len(outputs), failed=len(errors), expired=expired)
        self._running[record.id] = _Running(
            record=counted, lines=[line for line in lines if line.custom_id not in done]
        )
        log.info("batch.resumed", batch_id=record.id, status=record.status, done=len(done), left=len(lines) - len(done))

    async def _tick(self, group: TaskGroup) -> None:
        now = time.time()
        for each in list(self._running.values()):
            await self._advance(each, now)
        while self._rows < self.max_rows and self._live() < self.live_limit:
            run = next((each for each in self._running.values() if _sending(each, now)), None)
            if run is None:
                return
            line = run.lines[run.next]
            run.next += 1
            refusal = line_refusal(line, run.record.endpoint)
            if refusal is not None:
                await self._record_line(
                    run, ERRORS, failed_line(line_id=_line_id(), custom_id=line.custom_id, error=refusal)
                )
                continue
            self._rows += 1
            run.in_flight[line.custom_id] = anyio.Event()
            group.start_soon(self._row, run, line)

    async def _advance(self, run: _Running, now: float) -> None:
        """Move a batch along its statuses: taken up, past its window or cancelled, or out of lines."""
        status = run.record.status
        if status == "validating":
            await self._save(run, status="in_progress", in_progress_at=int(now))
        elif status == "cancelling" or (status == "in_progress" and now >= run.record.expires_at):
            for abort in run.in_flight.values():
                abort.set()
            if not run.in_flight:
                await self._end(run, now)
        elif status in ("in_progress", "finalizing") and run.next >= len(run.lines) and not run.in_flight:
            await self._finish(run, "completed")

    async def _end(self, run: _Running, now: float) -> None:
        if run.record.status == "cancelling":
            await self._finish(run, "cancelled")
            return
        for line in run.lines[run.next :] + run.cut:
            expired = failed_line(line_id=_line_id(), custom_id=line.custom_id, error=expired_error())
            await self._record_line(run, ERRORS, expired, expired=True)
        run.next = len(run.lines)
        await self._finish(run, "expired")

    async def _finish(self, run: _Running, status: str) -> None:
        """Finalize: an OpenAI batch's results become files; then the batch ends with `status`."""
        now = int(time.time())
        await self._save(run, status="finalizing", finalizing_at=run.record.finalizing_at or now)
        output_id = await self._adopt(run.record, OUTPUT) if run.record.api == "openai" else None
        error_id = await self._adopt(run.record, ERRORS) if run.record.api == "openai" else None
        await self._save(run, status=status, output_file_id=output_id, error_file_id=error_id, **{f"{status}_at": now})
        del self._running[run.record.id]
        log.info("batch.ended", batch_id=run.record.id, status=status, completed=run.record.completed)

    async def _adopt(self, record: BatchRecord, name: str) -> str | None:
        path = self.batches.result_path(record.id, name)
        if not path.exists() or path.stat().st_size == 0:
            return None
        filename = f"{record.id}_{'output' if name == OUTPUT else 'error'}.jsonl"
        adopt = self.files.adopt
        stored = await anyio.to_thread.run_sync(
            lambda: adopt(path, filename=filename, purpose="batch_output", owner=record.owner)
        )
        return stored.id

    async def _row(self, run: _Running, line: BatchLine) -> None:
        abort = run.in_flight[line.custom_id]
        line_id = _line_id()
        try:
            try:
                result: LineResult | None = await run_line(self.app, line.url, line.body, abort, line_id)
            # The line fails alone (docs/STYLE.md, "Failures are values, crashes are fatal").
            except Exception as error:  # noqa: BLE001
                log.warning("batch.line_failed", batch_id=run.record.id, custom_id=line.custom_id, reason=repr(error))
                result = None
            if abort.is_set():
                # Cut by a cancel, the window or a stop: not done, so not written here.
                run.cut.append(line)
                return
            await self._write(run, line, line_id, result)
        finally:
            # In flight until written: a batch whose last line is still being written is not yet finished.
            del run.in_flight[line.custom_id]
            self._rows -= 1
            self._wake.set()

    async def _write(self, run: _Running, line: BatchLine, line_id: str, result: LineResult | None) -> None:
        if result is not None and result.status in _BUSY:
            # Admission refused it for live work's sake, not for what it asks: it runs again later.
            run.lines.append(line)
            run.resting_until = time.time() + _REST_S
            return
        if result is None:
            error: JsonObject = {"code": "internal_error", "message": "The server failed this request"}
            await self._record_line(run, ERRORS, failed_line(line_id=line_id, custom_id=line.custom_id, error=error))
            return
        body: JsonValue = json.loads(result.body) if result.body else None
        written = output_line(
            line_id=line_id, custom_id=line.custom_id, status=result.status, request_id=result.request_id, body=body
        )
        await self._record_line(run, OUTPUT if result.status == 200 else ERRORS, written)

    async def _record_line(self, run: _Running, name: str, line: JsonObject, *, expired: bool = False) -> None:
        await anyio.to_thread.run_sync(self.batches.append, run.record.id, name, line)
        record = run.record
        if name == OUTPUT:
            run.record = attrs.evolve(record, completed=record.completed + 1)
            self._completed += 1
        else:
            run.record = attrs.evolve(record, failed=record.failed + 1, expired=record.expired + int(expired))
            self._failed += 1

    async def _save(self, run: _Running, **changes: str | int | None) -> BatchRecord:
        """The record with `changes`, now the run's, and written (with whatever changed since) once earlier saves
        are."""
        changed = run.record = attrs.evolve(run.record, **changes)  # type: ignore[arg-type]
        async with run.saving:
            await anyio.to_thread.run_sync(self.batches.save, run.record)
        return changed

    def _live(self) -> int:
        """Live requests admitted now: every engine's admitted requests, less this runner's own lines."""
        hosts = self.fleet.hosts.values()
        admitted = sum(
            host.engine.statistics().admission.in_flight for host in hosts if isinstance(host.engine, Engine)
        )
        return max(0, admitted - self._rows)


def _sending(run: _Running, now: float) -> bool:
    """Whether the batch has a line to send now: running, inside its window, lines left."""
    return (
        run.record.status == "in_progress"
        and now < run.record.expires_at
        and run.next < len(run.lines)
        and now >= run.resting_until
    )


def _line(raw: JsonObject) -> BatchLine:
    body = raw["body"]
    assert isinstance(body, dict)
    return BatchLine(custom_id=str(raw["custom_id"]), url=str(raw["url"]), body=body)


def _code(line: JsonObject) -> JsonValue:
    error = line.get("error")
    return error.get("code") if isinstance(error, dict) else None


def _line_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def files_folder(settings: Settings) -> tuple[Path, bool]:
    """Where files and batches live, and whether the folder is a temporary one the server removes at its stop.

    `MLX_RELAY_FILES_DIR`, else `files/` beside a sqlite:// Responses store, else a fresh temporary folder: with
    the memory store, files live as long as the server, as its stored responses do.
    """
    if settings.files_dir:
        return Path(settings.files_dir).expanduser(), False
    url = settings.response_store or ""
    sqlite = store_path(url) if url.startswith("sqlite") else None
    if sqlite is not None:
        return sqlite.parent / "files", False
    return Path(tempfile.mkdtemp(prefix="mlx-relay-files-")), True


async def open_batches(app: Quart, settings: Settings, fleet: Fleet) -> BatchRunner:
    """Open the file and batch stores, and the runner over them; the lifespan starts its `run`."""
    root, temporary = files_folder(settings)
    files = await anyio.to_thread.run_sync(
        lambda: FileStore(root / "uploads", settings.files_max_bytes, settings.files_max_count)
    )
    batches = await anyio.to_thread.run_sync(BatchStore, root / "batches")
    runner = BatchRunner(
        app=app,
        fleet=fleet,
        files=files,
        batches=batches,
        live_limit=settings.batch_live_limit,
        max_rows=settings.batch_rows,
        window=settings.batch_window,
        temporary=temporary,
    )
    return runner
