"""The worker's model side, read from the same settings the front read: what `make_gateway` builds from."""

from __future__ import annotations

from functools import partial

import anyio
import anyio.to_thread
import attrs

from pipeline.settings import Settings
from stages.adapters import read_adapters
from stages.engine.decisions import choose_markup, disk_tier, kv_scheme
from stages.engine.model_side import ModelSide
from stages.engine.weight_forms import plan_weights
from stages.engine.work_service import dedicated_work
from stages.kv.plan import assess
from stages.model_thread.embed import SideModel
from stages.model_thread.exclusive import ExclusiveQueue
from stages.models.loading import load_tokenizer, resolve_model
from stages.prompt.constraints import ConstraintCompiler
from stages.prompt.prepare import Reservation


@attrs.frozen(kw_only=True)
class WorkerModel:
    side: ModelSide
    # Grammars arrive as text and compile here again (a compiled matcher cannot cross), from this cache.
    compiler: ConstraintCompiler
    # The dedicated embedding model's, when one is served.
    embedder: SideModel | None


async def open_model(settings: Settings, *, measured_bandwidth: float | None = None) -> WorkerModel:
    """Everything but the weights, which the gateway's model thread loads. `measured_bandwidth`: the front's copy
    figure, which the plan uses rather than probing again."""
    info = await anyio.to_thread.run_sync(
        partial(resolve_model, settings.model, demo=settings.demo_model, name=settings.model_name)
    )
    if settings.context_limit:
        info = attrs.evolve(info, context_window=min(info.context_window, settings.context_limit))
    tokenizer = await anyio.to_thread.run_sync(load_tokenizer, info)
    adapters = tuple(await anyio.to_thread.run_sync(read_adapters, settings.adapters))
    exclusive = ExclusiveQueue.of(settings)
    embedder, embedding_bytes = None, 0
    if settings.embedding_model is not None:
        reservation = Reservation.of(settings.prepare_concurrency)
        work, embedding_bytes = await anyio.to_thread.run_sync(dedicated_work, settings, exclusive, reservation)
        work.preload()
        embedder = work.side
    family, _ = await anyio.to_thread.run_sync(partial(choose_markup, settings, tokenizer))
    fit_of = partial(
        assess,
        info.path,
        context_window=info.context_window,
        budget=settings.memory_budget,
        prompt_cache=settings.prompt_cache_bytes,
        max_batch=settings.max_batch,
        prefill_step=settings.prefill_step_size,
        adapter_bytes=sum(adapter.nbytes for adapter in adapters) + embedding_bytes,
        share=None,
        kv=kv_scheme(settings, None),
        measured_bandwidth=measured_bandwidth,
    )
    # The same plan and weight form the front chose (stages/engine/decisions.py), so the model thread loads them alike.
    fit, weights = await anyio.to_thread.run_sync(partial(plan_weights, settings, info, fit_of, cluster=None))
    info = attrs.evolve(info, float32_weights=weights.float32, sixteen_bit_weights=weights.sixteen_bit)
    disk = await anyio.to_thread.run_sync(
        partial(disk_tier, settings, info, fit.memory, cluster=None, adapters=adapters)
    )
    side = ModelSide(
        settings=settings,
        info=info,
        tokenizer=tokenizer,
        family=family,
        fit=fit,
        adapters=adapters,
        exclusive=exclusive,
        disk=disk,
    )
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=info.vocab_size, family=family)
    return WorkerModel(side=side, compiler=compiler, embedder=embedder)
