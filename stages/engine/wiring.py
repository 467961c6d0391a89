"""The engine's actors and the bounded channels between them, built once from its start-up record.

parse (its chat or text jobs) → prepare → gateway → sink: `wire` opens each channel, builds each stage over its
ends and chooses the gateway (stages/engine/gateway_face.py), in process or driving a model worker, here and nowhere
else.
The actors come back in the order the supervisor starts them: the model first, then downstream to upstream
(docs/STYLE.md, "Readiness from downstream").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.channels import Channel, open_channel
from pipeline.observe import RequestObserver
from pipeline.settings import Settings
from pipeline.supervision import Actor
from stages.engine.gateway_face import Gateway
from stages.engine.model_side import ModelSide, make_gateway
from stages.engine.startup import Startup
from stages.messages import Abort, Prepared, PrepareJob, PrepKind, StepOutputs, Submission
from stages.prompt.chat import ChatJobs
from stages.prompt.constraints import ConstraintCompiler
from stages.prompt.fim import find_infill
from stages.prompt.parse import ParseStage
from stages.prompt.prepare import PrepareStage, Reservation, prompt_room
from stages.prompt.text import TextJobs
from stages.remote.chat_gateway import RemoteGateway
from stages.remote.crossing import StartIn
from stages.remote.exclusive_queue import RemoteExclusiveQueue
from stages.reply.sink import CompletionSink
from stages.shard.watch import ShardWatch

# Steps delivered to the sink and not yet taken; the model thread waits once
# the gateway's `steps_ahead` more are undelivered on its side of the crossing.
_STEP_BUFFER = 4


@attrs.frozen(kw_only=True)
class Wiring:
    # The way in: every request in flight holds one admission ticket, and this inbox holds as many.
    parse_inbox: Channel[Submission]
    gateway: Gateway
    sink: CompletionSink
    actors: tuple[Actor, ...]


def wire(settings: Settings, startup: Startup, observer: RequestObserver, on_lost: Callable[[], None]) -> Wiring:
    """The engine's stages over their channels; `on_lost` is told when a follower rank is gone."""
    in_flight = settings.max_batch + settings.max_pending
    parse_inbox: Channel[Submission] = open_channel(in_flight, name="parse")
    jobs: Channel[PrepareJob] = open_channel(in_flight, name="prepare")
    prepared: Channel[Prepared] = open_channel(in_flight, name="gateway")
    # At most one abort per running row between two steps.
    control: Channel[Abort] = open_channel(settings.max_batch, name="control")
    steps: Channel[StepOutputs] = open_channel(_STEP_BUFFER, name="steps")
    gateway = _gateway(settings, startup, prepared.receive, control, steps.send)
    sink = CompletionSink(
        inbox=steps.receive,
        aborts=control.send.clone(),
        tokenizer=startup.tokenizer,
        family=startup.family,
        observer=observer,
    )
    info, cluster = startup.info, startup.cluster
    watch: list[Actor] = [ShardWatch(cluster=cluster, on_lost=on_lost)] if cluster else []
    prepare = _prepare(settings, startup, jobs.receive, prepared.send)
    parse = ParseStage(
        inbox=parse_inbox.receive,
        out=jobs.send,
        route=startup.served.adapter_of,
        chat=ChatJobs(
            tokenizer=startup.tokenizer,
            preamble=startup.preamble,
            vision=startup.work.vision,
            room=partial(prompt_room, info.context_window, startup.fit.memory.max_safe_context),
            think=startup.family.think,
        ),
        text=TextJobs(vocab_size=info.vocab_size, infill=find_infill(startup.tokenizer)),
    )
    return Wiring(parse_inbox=parse_inbox, gateway=gateway, sink=sink, actors=(*watch, gateway, sink, prepare, parse))


def _gateway(
    settings: Settings,
    startup: Startup,
    inbox: MemoryObjectReceiveStream[Prepared],
    control: Channel[Abort],
    out: MemoryObjectSendStream[StepOutputs],
) -> Gateway:
    exclusive = startup.exclusive
    if isinstance(exclusive, RemoteExclusiveQueue):
        return RemoteGateway(
            inbox=inbox,
            control=control.receive,
            aborts=control.send,
            out=out,
            exclusive=exclusive,
            settings=settings,
            capacity=2 * (settings.max_batch + settings.max_pending + settings.exclusive_pending) + 3,
            start=StartIn(
                info=startup.info, fit=startup.fit, adapters=startup.served.adapters, think=startup.family.think
            ),
        )
    side = ModelSide(
        settings=settings,
        info=startup.info,
        tokenizer=startup.tokenizer,
        think=startup.family.think,
        fit=startup.fit,
        adapters=startup.served.adapters,
        exclusive=exclusive,
        disk=startup.disk,
        cluster=startup.cluster,
    )
    return make_gateway(side, inbox, control, out)


def _prepare(
    settings: Settings,
    startup: Startup,
    inbox: MemoryObjectReceiveStream[PrepareJob],
    out: MemoryObjectSendStream[Prepared],
) -> PrepareStage:
    info = startup.info
    reservations = {
        PrepKind.TOKENIZE: startup.tokenizing,
        PrepKind.CONSTRAIN: Reservation.of(settings.constraint_concurrency),
        PrepKind.CONSTRAIN_LARGE: Reservation.of(1),
    }
    return PrepareStage(
        inbox=inbox,
        out=out,
        reservations=reservations,
        context_window=info.context_window,
        vocab_size=info.vocab_size,
        max_safe_context=startup.fit.memory.max_safe_context,
        compiler=ConstraintCompiler(tokenizer=startup.tokenizer, vocab_size=info.vocab_size, family=startup.family),
        encoder=startup.encoder,
    )
