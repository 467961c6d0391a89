"""What an engine decides once, at its start, before it is built: one frozen `Startup` record.

`start_up` runs the start-up decisions (`decisions.py`) in their order, off the loop: the ranks joined under
`--shard`, the served model and its tokenizer, the LoRA adapters and the dedicated embedding model, the markup
family, the chat model's work service, the memory plan with the weights' form, and the prompt cache's disk tier.
The engine (`engine.py`) is built from the record and never changes it, so what `/stats`, `/health` and the routes
read of a model (`info`, `fit`, `served`...) is fixed for the engine's life.
"""

from __future__ import annotations

from functools import partial

import anyio
import attrs

from pipeline.settings import Settings, parse_aliases
from stages.adapters import AdapterError, ServedModels, read_adapters
from stages.cache.disk import DiskTier
from stages.engine.decisions import choose_markup, disk_tier, plan_memory, served_model, vision_prompt
from stages.engine.work_service import ModelWork, chat_model_work, open_embedder
from stages.families.base import Family
from stages.kv.plan import Fit
from stages.model_thread.exclusive import ExclusiveQueue
from stages.models.loading import ModelInfo, Tokenizer, load_tokenizer
from stages.models.weights import WeightForm
from stages.prompt.prepare import Reservation
from stages.prompt.tokenize import BoundedEncoder
from stages.remote.exclusive_queue import RemoteExclusiveQueue
from stages.shard.cluster import Cluster, join
from stages.shard.work import ReplicatedWork


@attrs.frozen(kw_only=True)
class Startup:
    # Work between decode steps (embeddings, scores): queued in process, or sent to the model's worker.
    exclusive: ExclusiveQueue
    # Chat templates render under one reservation, for generation and for counting alike.
    tokenizing: Reservation
    # The ranks this model is sharded over (stages/shard/); None in one process.
    cluster: Cluster | None
    info: ModelInfo
    tokenizer: Tokenizer
    encoder: BoundedEncoder
    family: Family
    preamble: Family | None
    # The model ids served: the base model's and its LoRA adapters'.
    served: ServedModels
    # The chat model's tokenizing, embeddings and scores, and the routes that queue them.
    work: ModelWork
    # The dedicated embedding model's (MLX_RELAY_EMBEDDING_MODEL); None: embeddings come from the chat model.
    embedder: ModelWork | None
    fit: Fit
    # As stored, or dequantized to float32 for the CPU backend; named in /stats.
    weights: WeightForm
    # The prompt cache's disk tier, in process only (a worker opens its own).
    disk: DiskTier | None


async def start_up(settings: Settings) -> Startup:
    """Every start-up decision, in order; raises what a model that cannot be served raises."""
    exclusive = (ExclusiveQueue if settings.model_in_process else RemoteExclusiveQueue).of(settings)
    tokenizing = Reservation.of(settings.prepare_concurrency)
    cluster = None
    if settings.shard:
        # Blocks until every rank mlx.launch started has joined.
        cluster = await anyio.to_thread.run_sync(partial(join, settings.shard, timeout=settings.shard_timeout))
    info = await anyio.to_thread.run_sync(served_model, settings)
    tokenizer = await anyio.to_thread.run_sync(load_tokenizer, info)
    vision = await anyio.to_thread.run_sync(partial(vision_prompt, settings, info, tokenizer))
    adapters = await anyio.to_thread.run_sync(read_adapters, settings.adapters)
    opened = partial(open_embedder, settings, exclusive, tokenizing, chat=info.name, sharded=cluster is not None)
    embedder, embedder_bytes = await anyio.to_thread.run_sync(opened)
    if embedder is not None:
        embedder.preload()
    served = ServedModels(
        base=info.name,
        adapters=adapters,
        aliases=parse_aliases(settings.model_aliases),
        embedding=embedder.name if embedder else None,
        default_adapter=settings.default_adapter,
    )
    if cluster is not None:
        # Followers replay the generator's calls: an adapter mounted on rank 0 alone would split the group.
        if adapters:
            raise AdapterError(
                "MLX_RELAY_ADAPTERS cannot be served with --shard (adapters are mounted on one process only)"
            )
        # Embeddings and scores: every rank runs each chunk's forward pass.
        exclusive.run_chunks_with(ReplicatedWork(cluster.step_log))
    encoder = await anyio.to_thread.run_sync(BoundedEncoder.of, tokenizer)
    family, preamble = await anyio.to_thread.run_sync(partial(choose_markup, settings, tokenizer))
    chat_work = partial(chat_model_work, settings, exclusive, info, encoder, tokenizing, preamble, vision)
    work = await anyio.to_thread.run_sync(chat_work)
    adapter_bytes = served.adapter_bytes + embedder_bytes + (vision.held_bytes if vision else 0)
    planned = partial(plan_memory, settings, info, adapter_bytes=adapter_bytes, cluster=cluster)
    info, fit, weights = await anyio.to_thread.run_sync(planned)
    disk = None
    if settings.model_in_process:
        tier = partial(disk_tier, settings, info, fit.memory, cluster=cluster, adapters=adapters)
        disk = await anyio.to_thread.run_sync(tier)
    return Startup(
        exclusive=exclusive,
        tokenizing=tokenizing,
        cluster=cluster,
        info=info,
        tokenizer=tokenizer,
        encoder=encoder,
        family=family,
        preamble=preamble,
        served=served,
        work=work,
        embedder=embedder,
        fit=fit,
        weights=weights,
        disk=disk,
    )
