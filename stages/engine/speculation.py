"""Speculative decoding as the settings ask for it, decided at start: which drafter, and what refuses it.

Prompt lookup (stages/model_thread/drafters.py's `PromptLookup`: proposals
from the row's own tokens) is on by default (`MLX_RELAY_PROMPT_LOOKUP`
unset or `auto`): the batch's measured gate speculates only at the batch
sizes where it measures a gain, and where it cannot run at all (a sharded
model, LoRA adapters, cache layers that cannot be cut back, a draft model
named) it stays off quietly, the reason in `/stats` (`gateway.speculation_off`).
Asked for (`--prompt-lookup`, `=1`), or `--draft-model NAME|PATH` (a second
model, which must share the target's vocabulary), each combination the
batch cannot speculate under is refused at start, naming it: both drafters
at once, a sharded model, LoRA adapters, and models whose cache layers
cannot be cut back (sliding-window, recurrent). The draft model is checked
and loads on the model thread, beside the target, before any row (a
refusal there fails the start as the KV scheme's does). Jump-forward
(`MLX_RELAY_JUMP_FORWARD`, on by default: a grammar's forced tokens
proposed and verified the same way) needs no drafter and is never refused:
where the batch cannot verify, rows take their forced tokens a step each.
docs/speculative-decoding.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from pipeline.settings import Settings
from stages.kv.machine import backend
from stages.model_thread.draft_model import DraftModel
from stages.model_thread.drafters import Drafter, PromptLookup, RowPolicy

if TYPE_CHECKING:
    from stages.model_thread.speculative_batch import Speculation
    from stages.models.loading import ModelInfo, Tokenizer

# Below this share of its proposed tokens accepted, a row stops proposing for a while.
MIN_ACCEPTANCE = 0.3


class SpeculationError(ValueError):
    """The speculation the settings ask for cannot serve this model or this set-up (raised at start)."""


def speculation_refusal(settings: Settings, *, sharded: bool, adapters: bool) -> str | None:
    """Why the speculation the settings ask for cannot run in this set-up, or None (also None when none is asked
    for: prompt lookup by default is never refused, `default_lookup_off` says where it stays off)."""
    if not (settings.prompt_lookup or settings.draft_model):
        return None
    named = "MLX_RELAY_PROMPT_LOOKUP=1" if settings.prompt_lookup else f"MLX_RELAY_DRAFT_MODEL={settings.draft_model}"
    if settings.prompt_lookup and settings.draft_model:
        return f"MLX_RELAY_PROMPT_LOOKUP=1 with MLX_RELAY_DRAFT_MODEL={settings.draft_model}: choose one drafter"
    return _cannot_run(named, settings, sharded=sharded, adapters=adapters)


def default_lookup_off(settings: Settings, *, sharded: bool, adapters: bool) -> str | None:
    """Why prompt lookup by default (`MLX_RELAY_PROMPT_LOOKUP` unset) stays off in this set-up, or None where it
    runs; None too when the settings decide (`=1`, `=0`, a draft model). The cache layers are judged at load."""
    if settings.prompt_lookup is not None or settings.draft_model:
        return None
    return _cannot_run("prompt lookup", settings, sharded=sharded, adapters=adapters)


def _cannot_run(named: str, settings: Settings, *, sharded: bool, adapters: bool) -> str | None:
    if sharded:
        return f"{named} cannot be served with MLX_RELAY_SHARD={settings.shard}: every rank would replay the proposals"
    if adapters:
        return f"{named} cannot be served with MLX_RELAY_ADAPTERS: each adapter's batch would need its own drafter"
    return None


def check_draft_tokenizer(name: str, target: Tokenizer) -> ModelInfo:
    """The draft model's files, refused unless its vocabulary is the target's (token ids must mean the same)."""
    from stages.models.loading import load_tokenizer, resolve_model

    info = resolve_model(name)
    draft: Any = load_tokenizer(info)
    served: Any = target
    if draft.vocab_size != served.vocab_size or draft.get_vocab() != served.get_vocab():
        raise SpeculationError(
            f"MLX_RELAY_DRAFT_MODEL={name}: its tokenizer differs from the served model's "
            "(a draft model must share the target's vocabulary)"
        )
    return info


@attrs.define
class SpeculationBuilder:
    """What the model thread calls with the loaded target to build the batch's speculation (None: none for this
    model), and why prompt lookup by default stays off (`/stats`' `gateway.speculation_off`)."""

    settings: Settings
    target: Tokenizer
    # Proposals from a drafter (prompt lookup or a draft model), not only the grammars' forced spans.
    drafting: bool
    # Prompt lookup by default, not asked for: where the cache cannot be cut back it stays off rather than refuse.
    default: bool
    # The grammars' forced spans are verified in one pass (not under a sharded model or adapters).
    jump_forward: bool
    off: str | None = None

    def __call__(self, model: Any) -> Speculation | None:
        from mlx_lm.models.cache import make_prompt_cache

        from stages.model_thread.jump_forward import JumpForward
        from stages.model_thread.speculative_batch import Speculation
        from stages.models.mlx_internals import PLAIN, ROTATING, cache_kind

        settings, drafting = self.settings, self.drafting
        if not drafting and not self.jump_forward:
            return None
        kind = cache_kind(make_prompt_cache(model))
        # A sliding-window layer is cut back after a verifying pass as a plain one is (mlx_internals.cut_batch_layer).
        cuttable = kind in (PLAIN, ROTATING)
        if not cuttable and self.default:
            self.off = f"prompt lookup: this model's cache has {kind} layers, which cannot be cut back"
            return None
        if not cuttable and not drafting:
            return None
        if not cuttable:
            raise SpeculationError(
                f"speculative decoding cannot serve this model: its cache has {kind} layers, which cannot be cut back "
                "to the accepted tokens; serve it without MLX_RELAY_PROMPT_LOOKUP / MLX_RELAY_DRAFT_MODEL"
            )
        policy = RowPolicy(
            max_k=settings.num_draft_tokens, min_acceptance=MIN_ACCEPTANCE, max_rows=speculation_rows(settings)
        )
        jump = JumpForward() if self.jump_forward else None
        drafter = _drafter(settings, self.target) if drafting else None
        return Speculation(drafter=drafter, policy=policy, jump_forward=jump)


def speculation_rows(settings: Settings) -> int:
    """Rows in the batch above which none speculates: the setting, else by backend. On a CPU a verifying pass of
    1 + k positions a row is compute-bound, and beside other rows it cost more than it saved: SmolLM2's chat at N=4
    (bench.relay_variants, 3 rounds) gave 1.12x the tok/s on 0.89x the CPU speculating alone only, against up to 4
    rows. On Metal and CUDA the pass is memory-bound, and 4 rows gained on demo (docs/speculative-decoding.md)."""
    if settings.speculation_max_rows is not None:
        return settings.speculation_max_rows
    return 1 if backend() == "cpu" else 4


def speculation_factory(
    settings: Settings, target: Tokenizer, *, sharded: bool, adapters: bool
) -> SpeculationBuilder | None:
    """What the model thread calls with the loaded target to build the batch's speculation; None when it is off.

    Jump-forward alone (`MLX_RELAY_JUMP_FORWARD`, no drafter) is never refused: where it cannot run (sharded,
    LoRA adapters, a cache that cannot be cut back) rows decode their forced tokens a step each, and the
    builder gives None for such a model. Nor is prompt lookup by default: it stays off there, saying why.

    Raises:
        SpeculationError: now, for a set-up it cannot serve; on the model thread, at load, for a draft
            model of another vocabulary or a target whose cache cannot be cut back.
    """
    reason = speculation_refusal(settings, sharded=sharded, adapters=adapters)
    if reason is not None:
        raise SpeculationError(reason)
    off = default_lookup_off(settings, sharded=sharded, adapters=adapters)
    default = settings.prompt_lookup is None and not settings.draft_model and off is None
    drafting = bool(settings.prompt_lookup or settings.draft_model or default)
    jump = settings.jump_forward and not sharded and not adapters
    if not drafting and not jump and off is None:
        return None
    # Where nothing runs (builds None), a builder still tells /stats why prompt lookup by default is off.
    return SpeculationBuilder(settings, target, drafting=drafting, default=default, jump_forward=jump, off=off)


def _drafter(settings: Settings, target: Tokenizer) -> Drafter:
    """The drafter the settings name, a draft model loaded and checked (on the model thread)."""
    from mlx_lm.models.cache import make_prompt_cache

    from stages.models.loading import load_weights
    from stages.models.mlx_internals import PLAIN, cache_kind

    if not settings.draft_model:
        return PromptLookup()
    draft = load_weights(check_draft_tokenizer(settings.draft_model, target))
    draft_kind = cache_kind(make_prompt_cache(draft))
    if draft_kind != PLAIN:
        raise SpeculationError(
            f"MLX_RELAY_DRAFT_MODEL={settings.draft_model}: its cache has {draft_kind} layers, which cannot be cut "
            "back to the accepted tokens"
        )
    return DraftModel(model=draft)
