"""The engine: builds the stage actors, their channels, and the supervisor.

`Engine.run` resolves and loads the model, wires parse → chat | text →
prepare → gateway → sink with bounded channels, and runs them under one
`Supervisor`. `submit` is the only way in (admission first; docs/STYLE.md, "Admission"); `drain`
is the only way out: it refuses new work, closes the parse inbox so that
closing cascades stage by stage, and waits (bounded) for rows in flight to
finish before the model thread stops.
"""

from __future__ import annotations

from functools import partial

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.admission import Admission
from pipeline.channels import Channel, ReplySlot, open_channel
from pipeline.errors import engine_dead, shutting_down
from pipeline.observe import NullObserver, RequestObserver
from pipeline.requests import ChatRequest
from pipeline.settings import Settings, parse_aliases
from pipeline.supervision import Actor, Supervisor
from pipeline.tracing import Timeline
from stages.adapters import AdapterError, ServedModels, not_found, read_adapters
from stages.cache.disk import DiskTier
from stages.engine.decisions import choose_markup, disk_tier, plan_memory, served_model, vision_prompt
from stages.engine.gateway_face import Gateway
from stages.engine.model_side import ModelSide, make_gateway
from stages.engine.reports import AdmissionReport, EngineStatistics, TokenCount
from stages.engine.work_service import ModelWork, chat_model_work, open_embedder
from stages.families.base import Family
from stages.kv.plan import Fit
from stages.messages import Abort, Decoder, Prepared, PrepareJob, PrepKind, ReadBody, Reply, StepOutputs, Submission
from stages.model_thread.exclusive import ExclusiveQueue
from stages.models.loading import ModelInfo, Tokenizer, load_tokenizer
from stages.models.weights import WeightForm
from stages.prompt.chat import ChatJobs, render_edited
from stages.prompt.constraints import ConstraintCompiler
from stages.prompt.fim import find_infill
from stages.prompt.parse import ParseStage
from stages.prompt.prepare import PrepareStage, Reservation, prompt_room
from stages.prompt.text import TextJobs
from stages.prompt.tokenize import BoundedEncoder
from stages.remote.exclusive import RemoteExclusiveQueue
from stages.remote.gateway import RemoteGateway
from stages.remote.status import WorkerStatus
from stages.reply.sink import CompletionSink
from stages.shard.cluster import Cluster, join
from stages.shard.liveness import RankStatus
from stages.shard.watch import ShardWatch
from stages.shard.work import ReplicatedWork

log = structlog.get_logger(stage="engine")

# Steps delivered to the sink and not yet taken; the model thread waits once
# the gateway's `steps_ahead` more are undelivered on its side of the crossing.
_STEP_BUFFER = 4


@attrs.define
class Engine:
    _settings: Settings = attrs.field(alias="settings")
    # Told each request's latencies and tokens (the metrics exporter).
    _observer: RequestObserver = attrs.field(factory=NullObserver, alias="observer")
    _admission: Admission = attrs.field(init=False)
    _open: dict[str, Reply] = attrs.field(factory=dict, init=False)
    _submitted: int = attrs.field(default=0, init=False)
    _stopped: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _parse_inbox: Channel[Submission] = attrs.field(init=False)
    _supervisor: Supervisor = attrs.field(init=False)
    _gateway: Gateway = attrs.field(init=False)
    _sink: CompletionSink = attrs.field(init=False)
    fit: Fit = attrs.field(init=False)
    # As stored, or dequantized to float32 for the CPU backend; named in /stats.
    weights: WeightForm = attrs.field(init=False)
    # Chat templates render under one reservation, for generation and for counting alike.
    _tokenizing: Reservation = attrs.field(init=False)
    info: ModelInfo = attrs.field(init=False)
    # The model ids served: the base model's and its LoRA adapters'.
    served: ServedModels = attrs.field(init=False)
    tokenizer: Tokenizer = attrs.field(init=False)
    _encoder: BoundedEncoder = attrs.field(init=False)
    family: Family = attrs.field(init=False)
    _preamble: Family | None = attrs.field(default=None, init=False)
    # Work between decode steps (embeddings, scores), and the routes that queue it.
    _exclusive: ExclusiveQueue = attrs.field(init=False)
    work: ModelWork = attrs.field(init=False)
    # The dedicated embedding model's (MLX_RELAY_EMBEDDING_MODEL); None: embeddings come from the chat model.
    embedder: ModelWork | None = attrs.field(default=None, init=False)
    # The ranks this model is sharded over (stages/shard/); None in one process.
    _cluster: Cluster | None = attrs.field(default=None, init=False)
    _lost: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        settings = self._settings
        self._admission = Admission(
            capacity=settings.max_batch + settings.max_pending,
            timeout=settings.admission_timeout,
            retry_after=settings.retry_after,
        )
        self._tokenizing = Reservation.of(settings.prepare_concurrency)
        self._exclusive = (ExclusiveQueue if settings.model_in_process else RemoteExclusiveQueue).of(settings)

    def worker(self) -> WorkerStatus | None:
        return self._gateway.status()

    @property
    def dead(self) -> bool:
        return self._supervisor.dead or self._lost

    @property
    def ready(self) -> bool:
        ranks_alive = all(rank.alive for rank in self.ranks() or ())
        worker = self.worker()
        serving = worker is None or worker.state == "ready"
        draining = self._admission.statistics().draining
        return self._supervisor.running and not draining and ranks_alive and not self._lost and serving

    def ranks(self) -> list[RankStatus] | None:
        """Every rank's liveness when sharded; None in one process."""
        return self._cluster.ranks() if self._cluster is not None else None

    async def run(self, *, task_status: TaskStatus[Engine] = anyio.TASK_STATUS_IGNORED) -> None:
        settings = self._settings
        if settings.shard:
            # Blocks until every rank mlx.launch started has joined.
            self._cluster = await anyio.to_thread.run_sync(
                partial(join, settings.shard, timeout=settings.shard_timeout)
            )
        self.info = await anyio.to_thread.run_sync(served_model, settings)
        self.tokenizer = await anyio.to_thread.run_sync(load_tokenizer, self.info)
        vision = await anyio.to_thread.run_sync(partial(vision_prompt, settings, self.info, self.tokenizer))
        adapters = await anyio.to_thread.run_sync(read_adapters, settings.adapters)
        beside_bytes = await self._open_embedder() + (vision.held_bytes if vision else 0)
        self.served = ServedModels(
            base=self.info.name,
            adapters=adapters,
            aliases=parse_aliases(settings.model_aliases),
            embedding=self.embedder.name if self.embedder else None,
            default_adapter=settings.default_adapter,
        )
        if self._cluster is not None:
            # Followers replay the generator's calls: an adapter mounted on rank 0 alone would split the group.
            if adapters:
                raise AdapterError(
                    "MLX_RELAY_ADAPTERS cannot be served with --shard (adapters are mounted on one process only)"
                )
            # Embeddings and scores: every rank runs each chunk's forward pass.
            self._exclusive.run_chunks_with(ReplicatedWork(self._cluster.step_log))
        self._encoder = await anyio.to_thread.run_sync(BoundedEncoder.of, self.tokenizer)
        self.family, self._preamble = await anyio.to_thread.run_sync(partial(choose_markup, settings, self.tokenizer))
        chat_work = partial(
            chat_model_work,
            settings,
            self._exclusive,
            self.info,
            self._encoder,
            self._tokenizing,
            self._preamble,
            vision,
        )
        self.work = await anyio.to_thread.run_sync(chat_work)
        adapter_bytes = self.served.adapter_bytes + beside_bytes
        planned = partial(plan_memory, settings, self.info, adapter_bytes=adapter_bytes, cluster=self._cluster)
        self.info, self.fit, self.weights = await anyio.to_thread.run_sync(planned)
        disk = None
        if settings.model_in_process:
            tier = partial(disk_tier, settings, self.info, self.fit.memory, cluster=self._cluster, adapters=adapters)
            disk = await anyio.to_thread.run_sync(tier)
        self._supervisor = Supervisor(actors=self._build_actors(disk), on_stop=self._on_stop)
        memory = self.fit.memory
        log.info(
            "engine.starting",
            model=self.info.name,
            path=str(self.info.path),
            max_safe_context=memory.max_safe_context,
            memory_budget=memory.budget_bytes,
            prompt_cache_bytes=memory.prompt_cache_bytes,
            weights=self.weights.description,
        )
        await self._supervisor.run(task_status=_Relay(task_status, self))

    def model_work(self, model: str | None) -> ModelWork:
        """Who answers embeddings, rerank and score naming `model`: the dedicated model when it is named (or none
        is), else the chat model.

        Raises:
            RequestError: 404 `model_not_found` for an unknown name while two models are served.
        """
        if self.embedder is None:
            return self.work
        named = self.served.aliases.get(model, model) if model else self.embedder.name
        if named == self.embedder.name:
            return self.embedder
        if not self.served.knows(named):
            raise not_found(named, "model", served=(*self.served.ids, *self.served.aliases))
        return self.work

    async def _open_embedder(self) -> int:
        settings, sharded = self._settings, self._cluster is not None
        opened = partial(
            open_embedder, settings, self._exclusive, self._tokenizing, chat=self.info.name, sharded=sharded
        )
        self.embedder, nbytes = await anyio.to_thread.run_sync(opened)
        if self.embedder is not None:
            self.embedder.preload()
        return nbytes

    async def submit(self, *, request_id: str, trace_id: str, body: bytes | ReadBody, decode: Decoder) -> Reply:
        """Admit a request and start it down the pipeline.

        Raises:
            RequestError: 429 when full, 503 when draining or dead.
        """
        if self.dead:
            raise engine_dead()
        await self._admission.enter()
        reply: Reply = ReplySlot(request_id, trace_id, on_done=partial(self._release, request_id))
        self._open[request_id] = reply
        self._submitted += 1
        # Every request in flight holds one admission ticket and sits in at
        # most one channel, and the parse inbox holds all tickets: never full.
        self._parse_inbox.send.send_nowait(
            Submission(request_id=request_id, body=body, decode=decode, reply=reply, timeline=Timeline.start())
        )
        return reply

    async def count_tokens(self, request: ChatRequest) -> TokenCount:
        """Prompt tokens of a chat request, rendered as generation would render it.

        Raises:
            RequestError: the template refused the conversation, or the
                prompt is past the context window (counting stops there).
        """
        if request.context_edits:
            edited = partial(render_edited, self.tokenizer, request, preamble=self._preamble)
            rendered = await anyio.to_thread.run_sync(edited, limiter=self._tokenizing.threads)
            return TokenCount(input_tokens=len(rendered.tokens), original_input_tokens=rendered.original_tokens)
        return TokenCount(input_tokens=len(await self.work.tokenize_chat(request)))

    def start_draining(self) -> None:
        """New work is refused with 503 from now on; what is in flight goes on."""
        self._admission.start_draining()
        self._exclusive.start_draining()

    async def drain(self, timeout: float) -> None:
        self.start_draining()
        self._parse_inbox.send.close()
        with anyio.move_on_after(timeout):
            await self._stopped.wait()
        if not self._stopped.is_set():
            log.warning("engine.drain_timeout", open_requests=len(self._open))

    async def fresh_statistics(self) -> EngineStatistics:
        await self._gateway.refresh()
        return self.statistics()

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            admission=AdmissionReport.of(self._admission.statistics(), self.fit.memory),
            gateway=self._gateway.statistics(),
            prompt_cache=self._gateway.cache_statistics(),
            exclusive=self._exclusive.statistics(),
            sink_rows=self._sink.open_rows,
            submitted=self._submitted,
            running=self._supervisor.running,
            dead=self._supervisor.dead,
        )

    def _build_actors(self, disk: DiskTier | None) -> list[Actor]:
        settings, info, tokenizer = self._settings, self.info, self.tokenizer
        in_flight = settings.max_batch + settings.max_pending
        self._parse_inbox = open_channel(in_flight, name="parse")
        jobs: Channel[PrepareJob] = open_channel(in_flight, name="prepare")
        prepared: Channel[Prepared] = open_channel(in_flight, name="gateway")
        # At most one abort per running row between two steps.
        control: Channel[Abort] = open_channel(settings.max_batch, name="control")
        steps: Channel[StepOutputs] = open_channel(_STEP_BUFFER, name="steps")
        self._gateway = self._make_gateway(prepared.receive, control, steps.send, disk)
        self._sink = CompletionSink(
            inbox=steps.receive,
            aborts=control.send.clone(),
            tokenizer=tokenizer,
            family=self.family,
            observer=self._observer,
        )
        watch: list[Actor] = [ShardWatch(cluster=self._cluster, on_lost=self._on_lost)] if self._cluster else []
        # Started in this order: the model loads first, then downstream to upstream
        # (docs/STYLE.md, "Readiness from downstream").
        return [
            *watch,
            self._gateway,
            self._sink,
            self._make_prepare(jobs.receive, prepared.send),
            ParseStage(
                inbox=self._parse_inbox.receive,
                out=jobs.send,
                route=self.served.adapter_of,
                chat=ChatJobs(
                    tokenizer=tokenizer,
                    preamble=self._preamble,
                    vision=self.work.vision,
                    room=partial(prompt_room, info.context_window, self.fit.memory.max_safe_context),
                    think=self.family.think,
                ),
                text=TextJobs(vocab_size=info.vocab_size, infill=find_infill(tokenizer)),
            ),
        ]

    def _make_gateway(
        self,
        inbox: MemoryObjectReceiveStream[Prepared],
        control: Channel[Abort],
        out: MemoryObjectSendStream[StepOutputs],
        disk: DiskTier | None,
    ) -> Gateway:
        settings, machine = self._settings, self.fit.machine
        if isinstance(self._exclusive, RemoteExclusiveQueue):
            return RemoteGateway(
                inbox=inbox,
                control=control.receive,
                aborts=control.send,
                out=out,
                exclusive=self._exclusive,
                settings=settings,
                capacity=2 * (settings.max_batch + settings.max_pending + settings.exclusive_pending) + 3,
                measured_bandwidth=machine.bandwidth_bytes_per_s if machine.bandwidth_source == "memcpy" else None,
            )
        side = ModelSide(
            settings=settings,
            info=self.info,
            tokenizer=self.tokenizer,
            family=self.family,
            fit=self.fit,
            adapters=self.served.adapters,
            exclusive=self._exclusive,
            disk=disk,
            cluster=self._cluster,
        )
        return make_gateway(side, inbox, control, out)

    def _make_prepare(
        self, inbox: MemoryObjectReceiveStream[PrepareJob], out: MemoryObjectSendStream[Prepared]
    ) -> PrepareStage:
        settings, info = self._settings, self.info
        reservations = {
            PrepKind.TOKENIZE: self._tokenizing,
            PrepKind.CONSTRAIN: Reservation.of(settings.constraint_concurrency),
            PrepKind.CONSTRAIN_LARGE: Reservation.of(1),
        }
        return PrepareStage(
            inbox=inbox,
            out=out,
            reservations=reservations,
            context_window=info.context_window,
            vocab_size=info.vocab_size,
            max_safe_context=self.fit.memory.max_safe_context,
            compiler=ConstraintCompiler(tokenizer=self.tokenizer, vocab_size=info.vocab_size, family=self.family),
            encoder=self._encoder,
        )

    def _release(self, request_id: str) -> None:
        del self._open[request_id]
        self._admission.leave()

    def _on_lost(self) -> None:
        """A follower rank is gone: no step can finish, so nothing in flight will."""
        self._lost = True
        self._admission.start_draining()
        for reply in list(self._open.values()):
            reply.fail(engine_dead())

    def _on_stop(self) -> None:
        error = engine_dead() if self._supervisor.dead else shutting_down()
        for reply in list(self._open.values()):
            reply.fail(error)
        self._exclusive.stop(dead=self._supervisor.dead)
        self._stopped.set()


@attrs.define
class _Relay(TaskStatus[None]):
    """Reports the engine, not None, when the supervisor says it is ready."""

    _outer: TaskStatus[Engine]
    _engine: Engine

    def started(self, value: None = None) -> None:
        self._outer.started(self._engine)
