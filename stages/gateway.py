"""Generation gateway: the one thread that runs MLX.

Inbox: `Prepared` requests (the pending queue), and `Abort`s on the control
channel. Outbox: one `StepOutputs` per decode step, for all rows, to the sink.
Owns: the model, mlx-lm's `BatchGenerator` and the row table, all on one
long-lived model thread (S12). The thread crosses to the event loop once
per step (`_exchange`): it hands over the step's outputs and takes new
rows and aborts in the same call, and it blocks there only while the batch
is empty.
On cancel: a host cancel interrupts the blocking wait or is noticed at the
next step; the thread then frees the generator and the model.
On error: an exception here is an engine failure and propagates (S20).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.events import FinishReason
from stages.messages import Abort, Admitted, Prepared, StepOutputs, TokenDelta

if TYPE_CHECKING:
    from mlx_lm.generate import BatchGenerator

log = structlog.get_logger(stage="gateway")

T = TypeVar("T")

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


@attrs.frozen(kw_only=True)
class Intake:
    aborts: tuple[Abort, ...]
    admitted: tuple[Prepared, ...]
    closed: bool


@attrs.frozen(kw_only=True)
class GatewayStatistics:
    active: int
    pending: int
    steps: int
    generated_tokens: int


@attrs.define
class GenerationGateway:
    _inbox: MemoryObjectReceiveStream[Prepared] = attrs.field(alias="inbox")
    _control: MemoryObjectReceiveStream[Abort] = attrs.field(alias="control")
    _aborts: MemoryObjectSendStream[Abort] = attrs.field(alias="aborts")
    _out: MemoryObjectSendStream[StepOutputs] = attrs.field(alias="out")
    _load: Callable[[], object] = attrs.field(alias="load")
    _eos_ids: frozenset[int] = attrs.field(alias="eos_ids")
    _max_batch: int = attrs.field(alias="max_batch")
    _prefill_step_size: int = attrs.field(alias="prefill_step_size")
    # uid -> request id, touched only by the model thread.
    _rows: dict[int, str] = attrs.field(factory=dict, init=False)
    _uids: dict[str, int] = attrs.field(factory=dict, init=False)
    _active: int = attrs.field(default=0, init=False)
    _steps: int = attrs.field(default=0, init=False)
    _generated: int = attrs.field(default=0, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # `task_status.started` must be called from this task, not the thread.
        loaded = anyio.Event()
        async with self._inbox, self._control, self._aborts, self._out, anyio.create_task_group() as group:
            group.start_soon(partial(anyio.to_thread.run_sync, limiter=anyio.CapacityLimiter(1)), self._model_loop, loaded.set)
            await loaded.wait()
            task_status.started()

    def statistics(self) -> GatewayStatistics:
        return GatewayStatistics(
            active=self._active,
            pending=self._inbox.statistics().current_buffer_used,
            steps=self._steps,
            generated_tokens=self._generated,
        )

    # -- model thread -------------------------------------------------------

    def _model_loop(self, started: Callable[[], None]) -> None:
        import mlx.core as mx
        from mlx_lm.generate import BatchGenerator

        model = self._load()
        generator = BatchGenerator(
            model,
            stop_tokens=[[token] for token in sorted(self._eos_ids)],
            completion_batch_size=self._max_batch,
            prefill_batch_size=self._max_batch,
            prefill_step_size=self._prefill_step_size,
        )
        anyio.from_thread.run_sync(started)
        try:
            self._serve(generator)
        finally:
            generator.close()
            del generator, model
            mx.clear_cache()

    def _serve(self, generator: BatchGenerator) -> None:
        outputs: StepOutputs | None = None
        while True:
            # 1) hand over the last step, take new rows and aborts
            intake = anyio.from_thread.run(self._exchange, outputs, self._max_batch - len(self._rows))
            if intake.closed:
                return
            self._remove(generator, intake.aborts)
            admitted = self._insert(generator, intake.admitted)
            # 2) step every row at once
            deltas = self._step(generator) if self._rows else ()
            outputs = StepOutputs(admitted=admitted, deltas=deltas, stepped_at=time.monotonic())

    def _insert(self, generator: BatchGenerator, prepared: tuple[Prepared, ...]) -> tuple[Admitted, ...]:
        from stages.sampling import make_row_processors, make_row_sampler

        admitted = []
        for row in prepared:
            (uid,) = generator.insert(
                [list(row.prompt_tokens)],
                max_tokens=[row.max_tokens],
                samplers=[make_row_sampler(row.params.sampling)],
                logits_processors=[make_row_processors(row.params.sampling, row.max_tokens)],
            )
            self._rows[uid], self._uids[row.request_id] = row.request_id, uid
            admitted.append(Admitted(prepared=row, admitted_at=time.monotonic()))
        return tuple(admitted)

    def _remove(self, generator: BatchGenerator, aborts: tuple[Abort, ...]) -> None:
        uids = [self._uids.pop(abort.request_id) for abort in aborts if abort.request_id in self._uids]
        if uids:
            generator.remove(uids)
            for uid in uids:
                del self._rows[uid]
            log.info("gateway.abort", rows=len(uids))

    def _step(self, generator: BatchGenerator) -> tuple[TokenDelta, ...]:
        anyio.from_thread.check_cancelled()
        _, generated = generator.next()
        deltas = []
        for response in generated:
            finish = _FINISH.get(response.finish_reason) if response.finish_reason else None
            request_id = self._rows[response.uid]
            deltas.append(TokenDelta(request_id=request_id, new_token_ids=(response.token,), finish=finish))
            if finish is not None:
                del self._rows[response.uid], self._uids[request_id]
        self._steps += 1
        self._generated += len(deltas)
        return tuple(deltas)

    # -- event loop ---------------------------------------------------------

    async def _exchange(self, outputs: StepOutputs | None, free: int) -> Intake:
        if outputs is not None and (outputs.admitted or outputs.deltas):
            await self._out.send(outputs)
        self._active = self._max_batch - free
        aborts = _drain(self._control, limit=None)
        admitted: list[Prepared] = []
        if free == self._max_batch and not aborts:
            try:
                admitted.append(await self._inbox.receive())
            except anyio.EndOfStream:
                return Intake(aborts=(), admitted=(), closed=True)
        admitted.extend(_drain(self._inbox, limit=free - len(admitted)))
        live = tuple(row for row in admitted if not row.reply.closed)
        for row in live:
            row.reply.bind_abort(partial(send_abort, self._aborts, row.request_id))
        self._active += len(live)
        return Intake(aborts=tuple(aborts), admitted=live, closed=False)


def send_abort(aborts: MemoryObjectSendStream[Abort], request_id: str) -> None:
    """Ask the gateway to drop a row before its next step; sync for S9.

    The control channel holds one abort per row, so it is never full; once
    the engine has stopped there is no row left to drop.
    """
    try:
        aborts.send_nowait(Abort(request_id=request_id))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass


def _drain(stream: MemoryObjectReceiveStream[T], *, limit: int | None) -> list[T]:
    items: list[T] = []
    while limit is None or len(items) < limit:
        try:
            items.append(stream.receive_nowait())
        except (anyio.WouldBlock, anyio.EndOfStream):
            break
    return items
