"""Generation gateway: the one thread that runs MLX.

Inbox: `Prepared` requests (the pending queue), and `Abort`s on the control
channel. Outbox: one `StepOutputs` per decode step, for all rows, to the
sink; evicted prompt-cache entries to the disk tier's writer
(`stages/cache/spiller.py`).
Owns: the model, mlx-lm's `BatchGenerator`, the row table, the prompt cache
(`stages/cache/prompt.py`) and the batch's KV account (`stages/kv/scheduler.py`),
all on one long-lived model thread (docs/STYLE.md, "One model thread"). The thread never waits for the
event loop (`stages/model_thread/handoff.py`): it takes new rows and aborts at the top of
each step and hands the step's outputs, spills and failed rows over after
it; it blocks only while it holds no row, or while `steps_ahead` steps are
still undelivered (back-pressure from a slow sink). A row is admitted
into the batch only when the KV the batch holds, with it, fits the
budget; until then it waits here, and upstream backs up into admission
(429). Rows the scheduler preempts leave their KV to the prompt cache and
resume from the head of the queue with their sampler and processors
rewound, so their output is unchanged.
On cancel: a host cancel ends the thread's waits or is noticed at the next
step; the thread then frees the generator and the model.
On error: a failure while admitting one row (its cache lookup, sampler,
grammar matcher) fails that row alone (`pipeline/actor.py`), handed to its
reply with that step's parcel. A failure of the step itself (MLX) is an
engine failure and propagates (docs/STYLE.md, "Failures are values, crashes are fatal"): the only one
that marks the engine dead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from stages.adapters import Adapter
from stages.cache.disk import DiskTier, SpillJob
from stages.cache.link import DiskLink
from stages.cache.prompt import PromptCache, PromptCacheStatistics
from stages.cache.spiller import Spiller
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import FULL, KvScheme
from stages.messages import Abort, Prepared, StepOutputs, TokenDelta, send_abort
from stages.model_thread.adapter_batches import make_generator
from stages.model_thread.batch_rows import BatchRows
from stages.model_thread.drafters import SpeculationStatistics
from stages.model_thread.encoder_cache import EncoderCacheStatistics
from stages.model_thread.exclusive import ExclusiveQueue, Job
from stages.model_thread.handoff import Handoff, HandoffStatistics, Parcel
from stages.model_thread.jump_forward import JumpForwardStatistics
from stages.model_thread.mixed_steps import MixedCounts, mixing
from stages.model_thread.rows import Waiting
from stages.model_thread.single_row import single_row
from stages.model_thread.speculative_batch import speculating
from stages.model_thread.step_budget import StepBudget
from stages.model_thread.vision_rows import VisionRows
from stages.models.heap import HeapTrimmer
from stages.models.mlx_internals import PLAIN, allocator_memory, cache_kind, restore_layer
from stages.models.quantized_kv import batch_generator

if TYPE_CHECKING:
    from mlx_lm.generate import BatchGenerator

    from stages.model_thread.speculative_batch import Speculation

log = structlog.get_logger(stage="gateway")


@attrs.frozen(kw_only=True)
class GatewayStatistics:
    active: int
    pending: int
    steps: int
    generated_tokens: int
    # Rows taken from the queue whose KV does not fit beside the running ones yet (preempted ones among them).
    waiting_for_memory: int
    # The KV the running rows hold, as the batch pads them, in whole cache blocks.
    kv_held_bytes: int
    kv_budget_bytes: int
    # Rows moved out of the batch under memory pressure, and rows that came back.
    preemptions: int
    resumed: int
    # What the batch's caches hold after the last step (they grow in 256-token blocks).
    kv_bytes_in_use: int
    # MLX's allocator after the last step: arrays alive, and freed buffers it keeps for reuse.
    mlx_active_bytes: int
    mlx_cache_bytes: int
    # The crossing to the event loop: steps undelivered, and the model thread's waits.
    handoff: HandoffStatistics
    # The step budget (stages/model_thread/step_budget.py): the last prefill chunk it chose (tokens a row), and the
    # steps that ran past the target (a step's decoding rows alone, or a first chunk before the speed was known).
    prefill_chunk: int = 0
    steps_over_budget: int = 0
    mixed_steps: int = 0  # steps that prefilled beside decoding rows in one pass (model_thread/mixed_steps.py)
    # Speculative decoding's proposals and what the target accepted (stages/model_thread/drafters.py); None when it
    # is off.
    speculation: SpeculationStatistics | None = None
    # Why prompt lookup, on by default, stays off for this model (sharded, adapters, cache layers that cannot be cut
    # back: stages/engine/speculation.py); None where it runs or the settings turned it off.
    speculation_off: str | None = None
    # Grammar-forced spans taken in one verifying pass (stages/model_thread/jump_forward.py); None when it is off.
    jump_forward: JumpForwardStatistics | None = None
    # A vision-language model's encoder-output cache and its encodes.
    encoder_cache: EncoderCacheStatistics | None = None


def _batch_rows(gateway: GenerationGateway) -> BatchRows:
    kv, eos, think = gateway._kv, gateway._eos_ids, gateway._think_ids
    return BatchRows(scheduler=kv, eos_ids=eos, think_ids=think, cache=gateway._cache)


@attrs.define
class GenerationGateway:
    _inbox: MemoryObjectReceiveStream[Prepared] = attrs.field(alias="inbox")
    _control: MemoryObjectReceiveStream[Abort] = attrs.field(alias="control")
    _aborts: MemoryObjectSendStream[Abort] = attrs.field(alias="aborts")
    _out: MemoryObjectSendStream[StepOutputs] = attrs.field(alias="out")
    _spills_out: MemoryObjectSendStream[SpillJob] = attrs.field(alias="spills_out")
    _spills_in: MemoryObjectReceiveStream[SpillJob] = attrs.field(alias="spills_in")
    _load: Callable[[], object] = attrs.field(alias="load")
    _eos_ids: frozenset[int] = attrs.field(alias="eos_ids")
    _max_batch: int = attrs.field(alias="max_batch")
    _prefill_step_size: int = attrs.field(alias="prefill_step_size")
    _kv: KvScheduler = attrs.field(alias="scheduler")
    _cache: PromptCache | None = attrs.field(default=None, alias="cache")
    _disk: DiskTier | None = attrs.field(default=None, alias="disk")
    # Rows whose prompts prefill together (the plan's figure); None: max_batch.
    _prefill_rows: int | None = attrs.field(default=None, alias="prefill_rows")
    # The think markers as token ids (the start may take several tokens, the end is one): thinking budgets need them.
    _think_ids: tuple[tuple[int, ...], int] | None = attrs.field(default=None, alias="think_ids")
    # LoRA adapters served beside the base model (stages/model_thread/adapter_batches.py groups their rows).
    _adapters: tuple[Adapter, ...] = attrs.field(default=(), alias="adapters")
    # Embeddings and scores, run on the model thread between two steps (stages/model_thread/exclusive.py).
    _exclusive: ExclusiveQueue | None = attrs.field(default=None, alias="exclusive")
    # Steps the model thread may run ahead of the sink before it waits.
    _steps_ahead: int = attrs.field(default=4, alias="steps_ahead")
    _handoff: Handoff = attrs.field(
        init=False,
        default=attrs.Factory(lambda g: Handoff(depth=g._steps_ahead, max_rows=g._max_batch), takes_self=True),
    )
    _spiller: Spiller = attrs.field(
        init=False,
        default=attrs.Factory(
            lambda g: Spiller(disk=g._disk, send=g._spills_out, receive=g._spills_in), takes_self=True
        ),
    )
    # Builds the batch generator: mlx-lm's `BatchGenerator`, or one every rank replays (stages/shard/).
    _make_generator: Callable[..., Any] | None = attrs.field(default=None, alias="make_generator")
    _single_row: bool = attrs.field(default=True, alias="single_row")
    _mixed_steps: bool = attrs.field(default=True, alias="mixed_steps")
    # How the rows' KV is stored: quantized, every row starts with quantized layers (stages/models/quantized_kv.py).
    _kv_scheme: KvScheme = attrs.field(default=FULL, alias="kv_scheme")
    # Seconds a step aims at, prefill chunks sized to fit it (stages/model_thread/step_budget.py); None: fixed ones.
    _step_budget_s: float | None = attrs.field(default=None, alias="step_budget_s")
    # Beside decoding rows a step aims at this multiple of their decode-only step (>= step_budget_s); 0: fixed.
    _step_budget_ratio: float = attrs.field(default=0.0, alias="step_budget_ratio")
    # Builds the batch's speculation from the loaded model (stages/engine/speculation.py), or None for a model it
    # cannot serve (jump-forward alone, on cache layers that cannot be cut back); None: no speculative decoding.
    _speculate: Callable[[Any], Speculation | None] | None = attrs.field(default=None, alias="speculation")
    _speculation: Speculation | None = attrs.field(default=None, init=False)
    _budget: StepBudget | None = attrs.field(default=None, init=False)
    _mixed: MixedCounts = attrs.field(factory=MixedCounts, init=False)
    # Bytes of vision-tower output kept per image (a vision-language model's; stages/model_thread/encoder_cache.py).
    _encoder_cache_bytes: int = attrs.field(default=0, alias="encoder_cache_bytes")
    # The share of decoding time image encodes may add while rows decode (MLX_RELAY_EXCLUSIVE_SHARE).
    _image_share: float = attrs.field(default=0.15, alias="image_share")
    # Touched only by the model thread.
    _batch: BatchRows = attrs.field(init=False, default=attrs.Factory(_batch_rows, takes_self=True))
    _spill_outbox: list[SpillJob] = attrs.field(factory=list, init=False)
    # Exclusive jobs finished on the model thread, handed over with the step's parcel.
    _finished: list[Job[Any]] = attrs.field(factory=list, init=False)
    # Published for statistics().
    _active: int = attrs.field(default=0, init=False)
    _steps: int = attrs.field(default=0, init=False)
    _generated: int = attrs.field(default=0, init=False)
    _kv_in_use: int = attrs.field(default=0, init=False)
    _mlx_memory: tuple[int, int] = attrs.field(default=(0, 0), init=False)
    _heap: HeapTrimmer = attrs.field(factory=HeapTrimmer, init=False)
    # What the model's cache layers are (mlx_internals.cache_kind), known once it is loaded.
    _cache_kind: str = attrs.field(default=PLAIN, init=False)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # `task_status.started` must be called from this task, not the thread.
        loaded = anyio.Event()
        if self._exclusive is not None:
            self._exclusive.wake_with(self._handoff.nudge)
        async with self._inbox, self._control, self._aborts, self._out, anyio.create_task_group() as group:
            group.start_soon(self._spiller.run)
            group.start_soon(self._model_task, loaded.set)
            await loaded.wait()
            task_status.started()

    def statistics(self) -> GatewayStatistics:
        return GatewayStatistics(
            active=self._active,
            pending=self._inbox.statistics().current_buffer_used,
            steps=self._steps,
            generated_tokens=self._generated,
            waiting_for_memory=len(self._batch.waiting),
            kv_held_bytes=self._kv.held_bytes,
            kv_budget_bytes=self._kv.budget_bytes,
            kv_bytes_in_use=self._kv_in_use,
            mlx_active_bytes=self._mlx_memory[0],
            mlx_cache_bytes=self._mlx_memory[1],
            preemptions=self._kv.preemptions,
            resumed=self._kv.resumed,
            handoff=self._handoff.statistics(),
            prefill_chunk=self._budget.last_chunk if self._budget is not None else 0,
            steps_over_budget=self._budget.over_target if self._budget is not None else 0,
            mixed_steps=self._mixed.steps,
            speculation=self._speculation.statistics() if self._speculation is not None else None,
            # The builder's (stages/engine/speculation.py's `SpeculationBuilder`), known once the model loaded.
            speculation_off=getattr(self._speculate, "off", None),
            jump_forward=self._speculation.jump_forward_statistics() if self._speculation is not None else None,
            encoder_cache=self._batch.vision.statistics() if self._batch.vision is not None else None,
        )

    def send_steps_with(self, write: Callable[[StepOutputs], None]) -> None:
        """Each step's outputs are written by the model thread with `write` rather than handed to the loop
        (a worker's frames to its front); set before `run`."""
        self._handoff.direct = write

    def status(self) -> None:
        """No worker: the model runs in this process."""
        return None

    async def refresh(self) -> None:
        """`statistics` is read from this process's own counters, current already."""

    def cache_statistics(self) -> PromptCacheStatistics | None:
        return self._cache.statistics() if self._cache is not None else None

    async def _model_task(self, started: Callable[[], None]) -> None:
        # Once the thread ends, the disk writer finishes its queue and stops.
        thread = partial(anyio.to_thread.run_sync, self._model_loop, started, limiter=anyio.CapacityLimiter(1))
        try:
            await self._handoff.run(
                thread, inbox=self._inbox, control=self._control, bind=self._bind_abort, send=self._deliver
            )
        finally:
            self._spiller.close()

    # -- model thread -------------------------------------------------------

    def _model_loop(self, started: Callable[[], None]) -> None:
        import mlx.core as mx
        from mlx_lm.generate import BatchGenerator

        model = self._load()
        self._prepare_cache(model)
        self._batch.vision = VisionRows.of(
            model, cache_bytes=self._encoder_cache_bytes, chunk=self._prefill_step_size, share=self._image_share
        )
        stops = [[token] for token in sorted(self._eos_ids)]
        generator_class = self._make_generator or batch_generator(BatchGenerator, self._kv_scheme)
        batch: Callable[[], Any] = partial(
            generator_class,
            model,
            stop_tokens=stops,
            completion_batch_size=self._max_batch,
            prefill_batch_size=min(self._max_batch, self._prefill_rows or self._max_batch),
            prefill_step_size=self._prefill_step_size,
        )
        self._speculation = self._speculate(model) if self._speculate is not None else None
        # Under a sharded generator every rank replays mlx-lm's own steps: neither greedy steps nor one pass a step
        # (a step that prefills beside decoding rows as one forward pass, which quantized KV does not take either).
        if self._make_generator is None:
            batch = speculating(batch, self._speculation)
        if self._mixed_steps and self._make_generator is None and not self._kv_scheme.quantized:
            batch = mixing(batch, model, self._cache_kind, self._mixed)
        # A row alone runs as generate_step does (stages/model_thread/single_row.py), speculating there too; never
        # under a sharded generator, nor with quantized KV (its plain layers would join a quantized batch).
        alone = self._make_generator is None and not self._kv_scheme.quantized
        enabled = self._single_row and alone and self._cache_kind == PLAIN
        solo = single_row(
            batch,
            enabled=enabled,
            model=model,
            stop_tokens=stops,
            prefill_step_size=self._prefill_step_size,
            speculation=self._speculation,
        )
        generator = make_generator(model, self._adapters, solo)
        # Not under a sharded generator: every rank would have to replay each step's chunk size.
        if self._step_budget_s is not None and self._make_generator is None:
            self._budget = StepBudget(
                target_s=self._step_budget_s, max_chunk=self._prefill_step_size, decode_ratio=self._step_budget_ratio
            )
        anyio.from_thread.run_sync(started)
        try:
            self._serve(generator)
        finally:
            generator.close()
            # The cache's arrays, like the model's, are freed on the thread that made them.
            del generator, model
            self._cache = self._batch.cache = None
            mx.clear_cache()

    def _prepare_cache(self, model: object) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        # Also what the single-row path needs (plain layers only).
        self._cache_kind = cache_kind(make_prompt_cache(model))
        if self._cache is None:
            return
        # Sliding-window and recurrent layers cannot be cut back to a shorter prefix once past their window:
        # keep each row's state at its prompt's end too, which the next turn of its conversation extends.
        log.info("prompt_cache.kind", kind=self._cache_kind, checkpoints=self._cache_kind != PLAIN)
        if self._disk is not None:
            self._disk.scan()
            self._cache.attach(DiskLink(self._disk, self._spill_outbox, restore_layer))

    def _serve(self, generator: BatchGenerator) -> None:
        while True:
            # 1) take new rows and aborts (waits only while no row is held); new rows queue before aborts apply
            pending = self._exclusive is not None and self._exclusive.pending
            intake = self._handoff.take(held=self._batch.held, other_work=pending)
            if self._exclusive is not None:
                self._finished.extend(self._exclusive.between_steps(generator.model, busy=bool(self._batch.rows)))
            if intake.closed:
                return
            self._batch.waiting.extend(Waiting(prepared=row) for row in intake.admitted)
            removed = self._batch.remove(generator, intake.aborts)
            # 2) admit the waiting rows whose KV fits; preempt if the next step would not
            admitted = self._batch.admit(generator)
            self._batch.preempt(generator)
            # 3) step every row at once
            deltas = self._step(generator) if self._batch.rows else ()
            self._active = len(self._batch.rows)
            # 4) give freed buffers back: MLX's cache when the batch empties, the C heap's pages on a clock
            self._release_memory(idle=not self._batch.rows and bool(deltas))
            # 5) hand the step over without waiting for the loop (unless `steps_ahead` are undelivered)
            outputs = StepOutputs(admitted=admitted, deltas=deltas, stepped_at=time.monotonic(), removed=removed)
            self._handoff.hand_over(self._parcel(outputs), held=self._batch.held)

    def _parcel(self, outputs: StepOutputs) -> Parcel | None:
        failed = self._batch.failed
        spills, finished = tuple(self._spill_outbox), tuple(self._finished)
        parcel = Parcel(outputs=outputs, spills=spills, failed=tuple(failed), finished=finished)
        self._spill_outbox.clear()
        failed.clear()
        self._finished.clear()
        return parcel if parcel.has_outputs or parcel.spills or parcel.failed or parcel.finished else None

    def _release_memory(self, *, idle: bool) -> None:
        import mlx.core as mx

        if idle:
            mx.clear_cache()
        self._heap.maybe(force=idle)

    def _step(self, generator: BatchGenerator) -> tuple[TokenDelta, ...]:
        anyio.from_thread.check_cancelled()
        budget = self._budget
        other_work = False
        if budget is not None:
            # The rows with no token yet prefill, as many at once as the batch takes.
            prefilling = self._batch.prefilling()
            rows = min(len(prefilling), self._prefill_rows or self._max_batch)
            decoding = len(self._batch.rows) - len(prefilling)
            other_work = self._exclusive is not None and self._exclusive.pending
            # The most any of them has past its cached prefix (a resumed row's output so far included): an upper
            # bound on what each has left, the batch's own progress not read here.
            longest = max((row.prompt_len + len(row.resume.generated) - row.cached for row in prefilling), default=0)
            generator.prefill_step_size = budget.chunk(
                prefilling=rows, decoding=decoding, other_work=other_work, longest=longest
            )
        began = time.perf_counter()
        prefilled, generated = generator.next()
        if budget is not None:
            budget.record(time.perf_counter() - began, prefilled, decoding=len(generated), other_work=other_work)
        if self._cache_kind != PLAIN:
            self._batch.checkpoint(generator, prefilled)
        deltas = self._batch.deltas(generated)
        self._steps += 1
        self._generated += len(deltas)
        self._kv_in_use = generator.prompt_cache_nbytes
        self._mlx_memory = allocator_memory()
        return deltas

    # -- event loop ---------------------------------------------------------

    async def _deliver(self, parcel: Parcel) -> None:
        for failure in parcel.failed:
            failure.row.reply.fail(failure.error)
        if parcel.has_outputs:
            await self._out.send(parcel.outputs)
        self._spiller.offer(parcel.spills)
        if parcel.finished and self._exclusive is not None:
            self._exclusive.deliver(parcel.finished)

    def _bind_abort(self, row: Prepared) -> None:
        row.reply.bind_abort(partial(send_abort, self._aborts, row.request_id))
