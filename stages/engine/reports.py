"""What the engine reports: a prompt's token count, and the snapshot `/stats` and `/health` read.

Frozen records (docs/STYLE.md, "One owner per state"): the engine builds them from its parts'
own snapshots, and nobody reaches into the engine for the figures.
"""

from __future__ import annotations

import attrs

from pipeline.admission import AdmissionStatistics
from stages.cache.prompt import PromptCacheStatistics
from stages.kv.plan import MemoryPlan
from stages.model_thread.exclusive import ExclusiveStatistics
from stages.model_thread.gateway import GatewayStatistics


@attrs.frozen(kw_only=True)
class TokenCount:
    """A prompt's tokens; with context edits, also its tokens before them."""

    input_tokens: int
    original_input_tokens: int | None = None


@attrs.frozen(kw_only=True)
class AdmissionReport(AdmissionStatistics):
    """The queue's admission figures, and memory admission's."""

    max_safe_context: int
    memory_budget_bytes: int
    usable_bytes: int
    weights_bytes: int

    @classmethod
    def of(cls, queue: AdmissionStatistics, memory: MemoryPlan) -> AdmissionReport:
        return cls(
            **attrs.asdict(queue),
            max_safe_context=memory.max_safe_context,
            memory_budget_bytes=memory.budget_bytes,
            usable_bytes=memory.usable_bytes,
            weights_bytes=memory.weights_bytes,
        )


@attrs.frozen(kw_only=True)
class EngineStatistics:
    admission: AdmissionReport
    gateway: GatewayStatistics
    prompt_cache: PromptCacheStatistics | None
    # Embeddings and scores: their queue and the model thread's time on them.
    exclusive: ExclusiveStatistics
    # Rows whose text state the sink holds; 0 whenever no request is in flight.
    sink_rows: int
    submitted: int
    running: bool
    dead: bool
