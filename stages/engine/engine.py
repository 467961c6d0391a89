"""The engine: one model's pipeline, built once its start-up decisions are known, and the way in and out of it.

`EngineStart` is what the fleet runs (fleet/model_host.py): it makes the start-up decisions (`startup.py`, one frozen
`Startup`), builds the `Engine` from them, runs it and reports it once it is ready. The engine wires parse (its chat
or text jobs) → prepare → gateway → sink with bounded channels (`wiring.py`) and runs them under one `Supervisor`.
`submit` is the only way in (admission first; docs/STYLE.md, "Admission"); `drain` is the only way out: it refuses
new work, closes the parse inbox so that closing cascades stage by stage, and waits (bounded) for rows in flight to
finish before the model side stops.
"""

from __future__ import annotations

from functools import partial

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus

from pipeline.admission import Admission
from pipeline.channels import ReplySlot
from pipeline.errors import engine_dead, shutting_down
from pipeline.observe import NullObserver, RequestObserver
from pipeline.requests import ChatRequest
from pipeline.settings import Settings
from pipeline.supervision import Supervisor
from pipeline.tracing import Timeline
from stages.adapters import ServedModels, not_found
from stages.engine.reports import AdmissionReport, EngineStatistics, TokenCount
from stages.engine.startup import Startup, start_up
from stages.engine.wiring import Wiring, wire
from stages.engine.work_service import ModelWork
from stages.families.base import Family
from stages.kv.plan import Fit
from stages.messages import Decoder, ReadBody, Reply, Submission
from stages.models.loading import ModelInfo, Tokenizer
from stages.models.weights import WeightForm
from stages.prompt.chat import render_edited
from stages.remote.status import WorkerStatus
from stages.shard.liveness import RankStatus

log = structlog.get_logger(stage="engine")


@attrs.define(kw_only=True)
class EngineStart:
    """One engine's life as the fleet runs it: its start-up, then the engine, reported (`task_status`) once ready."""

    settings: Settings
    # Told each request's latencies and tokens (the metrics exporter).
    observer: RequestObserver = attrs.field(factory=NullObserver)

    async def run(self, *, task_status: TaskStatus[Engine] = anyio.TASK_STATUS_IGNORED) -> None:
        startup = await start_up(self.settings)
        await Engine(settings=self.settings, observer=self.observer, startup=startup).run(task_status=task_status)


@attrs.define(kw_only=True)
class Engine:
    _settings: Settings = attrs.field(alias="settings")
    _observer: RequestObserver = attrs.field(alias="observer")
    # Fixed for the engine's life; the routes read the model's figures from it through the properties below.
    _startup: Startup = attrs.field(alias="startup")
    # Built with the engine, from the three above, and never replaced.
    _admission: Admission = attrs.field(init=False)
    _wiring: Wiring = attrs.field(init=False)
    _supervisor: Supervisor = attrs.field(init=False)
    # Live state, the only fields that change: the replies open (failed at once when the engine stops), the
    # requests submitted (for /stats), the stop the drain waits for, and a follower rank's loss (no step can end).
    _open: dict[str, Reply] = attrs.field(factory=dict, init=False)
    _submitted: int = attrs.field(default=0, init=False)
    _stopped: anyio.Event = attrs.field(factory=anyio.Event, init=False)
    _lost: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        settings = self._settings
        self._admission = Admission(
            capacity=settings.max_batch + settings.max_pending,
            timeout=settings.admission_timeout,
            retry_after=settings.retry_after,
        )
        self._wiring = wire(settings, self._startup, self._observer, on_lost=self._on_lost)
        self._supervisor = Supervisor(actors=self._wiring.actors, on_stop=self._on_stop)

    @property
    def info(self) -> ModelInfo:
        return self._startup.info

    @property
    def fit(self) -> Fit:
        return self._startup.fit

    @property
    def weights(self) -> WeightForm:
        """As stored, or dequantized to float32 for the CPU backend; named in /stats."""
        return self._startup.weights

    @property
    def served(self) -> ServedModels:
        """The model ids served: the base model's and its LoRA adapters'."""
        return self._startup.served

    @property
    def tokenizer(self) -> Tokenizer:
        return self._startup.tokenizer

    @property
    def family(self) -> Family:
        return self._startup.family

    @property
    def work(self) -> ModelWork:
        """The chat model's work between decode steps (embeddings, scores), and the routes that queue it."""
        return self._startup.work

    @property
    def embedder(self) -> ModelWork | None:
        """The dedicated embedding model's (MLX_RELAY_EMBEDDING_MODEL); None: embeddings come from the chat model."""
        return self._startup.embedder

    def worker(self) -> WorkerStatus | None:
        return self._wiring.gateway.status()

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
        cluster = self._startup.cluster
        return cluster.ranks() if cluster is not None else None

    async def run(self, *, task_status: TaskStatus[Engine] = anyio.TASK_STATUS_IGNORED) -> None:
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
        self._wiring.parse_inbox.send.send_nowait(
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
            edited = partial(render_edited, self.tokenizer, request, preamble=self._startup.preamble)
            rendered = await anyio.to_thread.run_sync(edited, limiter=self._startup.tokenizing.threads)
            return TokenCount(input_tokens=len(rendered.tokens), original_input_tokens=rendered.original_tokens)
        return TokenCount(input_tokens=len(await self.work.tokenize_chat(request)))

    def start_draining(self) -> None:
        """New work is refused with 503 from now on; what is in flight goes on."""
        self._admission.start_draining()
        self._startup.exclusive.start_draining()

    async def drain(self, timeout: float) -> None:
        self.start_draining()
        self._wiring.parse_inbox.send.close()
        with anyio.move_on_after(timeout):
            await self._stopped.wait()
        if not self._stopped.is_set():
            log.warning("engine.drain_timeout", open_requests=len(self._open))

    async def fresh_statistics(self) -> EngineStatistics:
        await self._wiring.gateway.refresh()
        return self.statistics()

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            admission=AdmissionReport.of(self._admission.statistics(), self.fit.memory),
            gateway=self._wiring.gateway.statistics(),
            prompt_cache=self._wiring.gateway.cache_statistics(),
            exclusive=self._startup.exclusive.statistics(),
            sink_rows=self._wiring.sink.open_rows,
            submitted=self._submitted,
            running=self._supervisor.running,
            dead=self._supervisor.dead,
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
        self._startup.exclusive.stop(dead=self._supervisor.dead)
        self._stopped.set()


@attrs.define
class _Relay(TaskStatus[None]):
    """Reports the engine, not None, when the supervisor says it is ready."""

    _outer: TaskStatus[Engine]
    _engine: Engine

    def started(self, value: None = None) -> None:
        self._outer.started(self._engine)
