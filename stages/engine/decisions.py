"""What the engine decides once at start-up from the model and the settings.

Each function here reads the loaded model (tokenizer, template, shape) or the
settings and returns one piece of the wiring the engine assembles: the markup
family, the think markers as ids, the cache tiers, a rank's share of the
model. Kept apart from `stages/engine/engine.py` so the engine reads as the actors'
lifecycle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import attrs
import structlog

from pipeline.settings import Settings
from stages.adapters import CONFIG, WEIGHTS, Adapter
from stages.cache.disk import DiskTier
from stages.cache.kv_file import adapter_fingerprint, model_fingerprint
from stages.cache.prompt import PromptCache
from stages.engine.weight_forms import plan_weights
from stages.families import choose_family
from stages.families.base import Family
from stages.families.preamble import template_ignores_tools
from stages.kv.plan import Fit, MemoryPlan, assess
from stages.kv.shape import FULL, KvScheme, ModelShape
from stages.models.loading import ModelInfo, Tokenizer, load_weights, resolve_model
from stages.models.weights import WeightForm
from stages.prompt.vision_chat import VisionPrompt
from stages.shard.caches import MirroredPromptCache
from stages.shard.cluster import Cluster
from stages.shard.rank_share import per_rank

log = structlog.get_logger(stage="engine")


def choose_markup(settings: Settings, tokenizer: Tokenizer) -> tuple[Family, Family | None]:
    """The model's family, and itself again where the template ignores `tools` (a preamble then describes them)."""
    family = choose_family(tokenizer, tool_parser=settings.tool_parser, reasoning_parser=settings.reasoning_parser)
    ignores = template_ignores_tools(
        lambda messages, tools: tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
    )
    log.info("engine.markup", family=family.name, think=family.think, tool_preamble=ignores)
    return family, family if ignores else None


def vision_prompt(settings: Settings, info: ModelInfo, tokenizer: Tokenizer) -> VisionPrompt | None:
    """A vision-language model's image side (its processor, the image limits); None for a text model."""
    return VisionPrompt.load(info.path, tokenizer, settings)


def think_ids(think: tuple[str, str] | None, tokenizer: Tokenizer) -> tuple[tuple[int, ...], int] | None:
    """The family's think markers as token ids: the start's (one or more), and the end's, where it is
    one token (a thinking budget forces it)."""
    if think is None:
        return None
    start, end = (tokenizer.encode(marker, add_special_tokens=False) for marker in think)
    return (tuple(start), end[0]) if start and len(end) == 1 else None


def disk_tier(
    settings: Settings,
    info: ModelInfo,
    memory: MemoryPlan,
    *,
    cluster: Cluster | None,
    adapters: Sequence[Adapter] = (),
) -> DiskTier | None:
    if not settings.cache_dir or not memory.prompt_cache_bytes:
        return None
    return open_disk(
        settings, info.path, cluster, adapters, float32=info.float32_weights, sixteen_bit=info.sixteen_bit_weights
    )


def open_disk(
    settings: Settings,
    path: Path,
    cluster: Cluster | None,
    adapters: Sequence[Adapter] = (),
    *,
    float32: bool = False,
    sixteen_bit: str | None = None,
) -> DiskTier | None:
    """The disk tier's folder for this model, and for this rank's slice of it when sharded; `float32`, `sixteen_bit`:
    the type the weights were dequantized to, if any."""
    if not settings.cache_dir:
        return None
    # One folder per model: a folder shared by several never mixes their KV.
    scheme = kv_scheme(settings, cluster)
    fingerprint = model_fingerprint(path, scheme.describe())
    root = Path(settings.cache_dir).expanduser() / fingerprint[:16]
    if cluster is not None:
        # Each rank holds its own slice of every entry: a folder, and a fingerprint in each file, per slice.
        piece = f"{cluster.mode}-rank{cluster.rank}-of-{cluster.size}"
        root, fingerprint = root / piece, hashlib.sha256(f"{fingerprint}:{piece}".encode()).hexdigest()
    if (form := "float32" if float32 else sixteen_bit) is not None:
        # Weights dequantized compute other keys and values than the stored ones.
        root, fingerprint = root / form, hashlib.sha256(f"{fingerprint}:{form}".encode()).hexdigest()
    # Within it, each adapter's entries are filed by its name and weights, so retrained weights never match.
    spaces = {adapter.name: adapter_fingerprint(adapter.path / CONFIG, adapter.path / WEIGHTS) for adapter in adapters}
    return DiskTier(
        root=root, max_bytes=settings.cache_dir_bytes, fingerprint=fingerprint, adapters=spaces, kv_scheme=scheme
    )


def prompt_cache(
    max_bytes: int, *, sessions: bool, cluster: Cluster | None, max_entries: int = 0
) -> PromptCache | None:
    if not max_bytes:
        return None
    if cluster is None:
        return PromptCache(max_bytes=max_bytes, sessions=sessions, max_entries=max_entries)
    return MirroredPromptCache(
        max_bytes=max_bytes, sessions=sessions, max_entries=max_entries, step_log=cluster.step_log
    )


def served_model(settings: Settings) -> ModelInfo:
    """The model the settings name, its window capped by `context_limit` (fleet/'s per-model defaults)."""
    info = resolve_model(settings.model, demo=settings.demo_model, name=settings.model_name)
    if settings.context_limit:
        # Every stage reads the window from the model's info, so the cap holds everywhere.
        info = attrs.evolve(info, context_window=min(info.context_window, settings.context_limit))
    return info


def plan_memory(
    settings: Settings, info: ModelInfo, *, adapter_bytes: int, cluster: Cluster | None
) -> tuple[ModelInfo, Fit, WeightForm]:
    """The memory plan and the weights' form, with `info` saying whether they are served dequantized."""
    fit = partial(
        assess,
        info.path,
        context_window=info.context_window,
        budget=settings.memory_budget,
        prompt_cache=settings.prompt_cache_bytes,
        max_batch=settings.max_batch,
        prefill_step=settings.prefill_step_size,
        adapter_bytes=adapter_bytes,
        share=rank_share(cluster, info.vocab_size),
        kv=kv_scheme(settings, cluster),
    )
    planned, weights = plan_weights(settings, info, fit, cluster=cluster)
    served = attrs.evolve(info, float32_weights=weights.float32, sixteen_bit_weights=weights.sixteen_bit)
    return served, planned, weights


def rank_share(cluster: Cluster | None, vocab_size: int) -> Callable[[ModelShape], ModelShape] | None:
    """How one rank's share of the model is figured, for the memory plan; None in one process."""
    if cluster is None:
        return None
    return partial(per_rank, mode=cluster.mode, ranks=cluster.size, vocab_size=vocab_size)


class KvSchemeError(ValueError):
    """The KV scheme the settings ask for cannot serve this model or this set-up (raised at start)."""


def kv_scheme(settings: Settings, cluster: Cluster | None) -> KvScheme:
    """The KV scheme of the settings, or the exact combination that refuses it."""
    if settings.kv_bits is None:
        return FULL
    named = f"MLX_RELAY_KV_BITS={settings.kv_bits}"
    if cluster is not None:
        raise KvSchemeError(
            f"{named} cannot be served with MLX_RELAY_SHARD={settings.shard}: a sharded model's KV is full precision"
        )
    if settings.quantized_kv_start:
        raise KvSchemeError(
            f"{named} with MLX_RELAY_QUANTIZED_KV_START={settings.quantized_kv_start}: the continuous batch quantizes "
            "every row from its first token (one batch layer cannot hold some rows quantized and others not); "
            "set it to 0"
        )
    return KvScheme(bits=settings.kv_bits, group_size=settings.kv_group_size)


def model_loader(info: ModelInfo, cluster: Cluster | None, scheme: KvScheme) -> Callable[[], object]:
    """What the gateway calls to load the weights, refusing at load (before any row) a model the KV scheme cannot
    serve."""
    if cluster is not None:
        return partial(cluster.load, info.path, float32=info.float32_weights)
    if not scheme.quantized:
        return partial(load_weights, info)

    def load() -> object:
        from stages.models.quantized_kv import refusal

        model = load_weights(info)
        reason = refusal(model, scheme)
        if reason is None and getattr(model, "vision_tower", None) is not None:
            reason = (
                f"MLX_RELAY_KV_BITS={scheme.bits} cannot serve a vision-language model yet: its image rows are "
                "prefilled into full-precision KV"
            )
        if reason is not None:
            raise KvSchemeError(reason)
        return model

    return load
