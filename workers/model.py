"""The worker's model side, built from what its front decided (`StartIn`): what `make_gateway` builds from.

The front has already resolved the model, planned its memory, chosen the
weights' form and the markup family, and read the adapters
(stages/engine/decisions.py, weight_forms.py); the worker takes those
decisions as they crossed and makes none of them again, so the model
thread loads what the front planned. It loads what cannot cross: the
tokenizer (and llguidance's, for grammars), the weights (on the model
thread) and a dedicated embedding model.
"""

from __future__ import annotations

from functools import partial

import anyio
import anyio.to_thread
import attrs

from pipeline.settings import Settings
from stages.engine.decisions import disk_tier
from stages.engine.model_side import ModelSide
from stages.engine.work_service import dedicated_work
from stages.model_thread.embed import SideModel
from stages.model_thread.exclusive import ExclusiveQueue
from stages.models.loading import load_tokenizer
from stages.prompt.constraints import ConstraintCompiler
from stages.prompt.prepare import Reservation
from stages.remote.crossing import StartIn


@attrs.frozen(kw_only=True)
class WorkerModel:
    side: ModelSide
    # Grammars arrive as text and compile here again (a compiled matcher cannot cross), from this cache; it
    # needs no family (only `grammar_for`, the front's, reads one).
    compiler: ConstraintCompiler
    # The dedicated embedding model's, when one is served.
    embedder: SideModel | None


async def open_model(settings: Settings, start: StartIn) -> WorkerModel:
    """Everything but the weights, which the gateway's model thread loads."""
    info = start.info
    tokenizer = await anyio.to_thread.run_sync(load_tokenizer, info)
    exclusive = ExclusiveQueue.of(settings)
    embedder = None
    if settings.embedding_model is not None:
        reservation = Reservation.of(settings.prepare_concurrency)
        # Its bytes are in the front's plan already.
        work, _ = await anyio.to_thread.run_sync(dedicated_work, settings, exclusive, reservation)
        work.preload()
        embedder = work.side
    disk = await anyio.to_thread.run_sync(
        partial(disk_tier, settings, info, start.fit.memory, cluster=None, adapters=start.adapters)
    )
    side = ModelSide(
        settings=settings,
        info=info,
        tokenizer=tokenizer,
        think=start.think,
        fit=start.fit,
        adapters=start.adapters,
        exclusive=exclusive,
        disk=disk,
    )
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=info.vocab_size)
    # Before ready, not at the first constrained row after every start (0.4 s of CPU on SmolLM2). Not on a thread
    # beside the weights' load: llguidance builds it in native code holding the GIL, so the load waits as long.
    # `MLX_RELAY_WARM_GRAMMAR=0` spares a model that never sees a constraint the cost, at its first one's expense.
    if settings.warm_grammar:
        await anyio.to_thread.run_sync(compiler.warm)
    return WorkerModel(side=side, compiler=compiler, embedder=embedder)
