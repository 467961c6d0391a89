"""The model side of one model: its gateway, built the same way in the front process or in a model worker.

`make_gateway` is what `Engine` runs in-process (`--in-process`, `--shard`)
and what a worker process runs behind the crossing (`workers/`): the one
model thread, its KV scheduler, its prompt cache and disk tier, and its
exclusive work.
"""

from __future__ import annotations

import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.channels import Channel, open_channel
from pipeline.settings import Settings
from stages.adapters import Adapter
from stages.cache.disk import DiskTier, SpillJob
from stages.engine.decisions import model_loader, prompt_cache, think_ids
from stages.engine.speculation import speculation_factory
from stages.kv.plan import Fit
from stages.kv.scheduler import KvScheduler
from stages.messages import Abort, Prepared, StepOutputs
from stages.model_thread.exclusive import ExclusiveQueue
from stages.model_thread.gateway import GenerationGateway
from stages.models.loading import ModelInfo, Tokenizer
from stages.shard.cluster import Cluster

# Evicted entries waiting for the disk writer; beyond this they are dropped,
# so a slow disk costs cache hits, never memory or request time.
_SPILL_QUEUE = 4


@attrs.frozen(kw_only=True)
class ModelSide:
    """What the gateway is built from, known once the model's files are read."""

    settings: Settings
    info: ModelInfo
    tokenizer: Tokenizer
    # The markup family's think markers: all of the family the model side reads (a worker gets them in `StartIn`).
    think: tuple[str, str] | None
    fit: Fit
    adapters: tuple[Adapter, ...]
    exclusive: ExclusiveQueue
    disk: DiskTier | None = None
    cluster: Cluster | None = None


def make_gateway(
    side: ModelSide,
    inbox: MemoryObjectReceiveStream[Prepared],
    control: Channel[Abort],
    out: MemoryObjectSendStream[StepOutputs],
) -> GenerationGateway:
    settings, memory, cluster, info = side.settings, side.fit.memory, side.cluster, side.info
    spills: Channel[SpillJob] = open_channel(_SPILL_QUEUE, name="spills")
    return GenerationGateway(
        inbox=inbox,
        control=control.receive,
        aborts=control.send,
        out=out,
        spills_out=spills.send,
        spills_in=spills.receive,
        load=model_loader(info, cluster, side.fit.model.kv_scheme),
        make_generator=None if cluster is None else cluster.make_generator,
        kv_scheme=side.fit.model.kv_scheme,
        single_row=settings.single_row,
        mixed_steps=settings.mixed_steps,
        speculation=speculation_factory(
            settings, side.tokenizer, sharded=cluster is not None, adapters=bool(side.adapters)
        ),
        eos_ids=frozenset(side.tokenizer.eos_token_ids),
        think_ids=think_ids(side.think, side.tokenizer),
        max_batch=settings.max_batch,
        prefill_step_size=settings.prefill_step_size,
        step_budget_s=settings.step_budget_ms / 1000,
        step_budget_ratio=settings.step_budget_ratio,
        encoder_cache_bytes=settings.encoder_cache_bytes,
        image_share=settings.exclusive_share,
        scheduler=KvScheduler(side.fit.model, memory.usable_bytes),
        prefill_rows=memory.prefill_rows,
        cache=prompt_cache(
            memory.prompt_cache_bytes,
            sessions=settings.session_cache,
            cluster=cluster,
            max_entries=settings.prompt_cache_entries,
        ),
        disk=side.disk,
        adapters=side.adapters,
        exclusive=side.exclusive,
    )
