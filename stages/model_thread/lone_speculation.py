"""Speculative decoding for a row running alone (stages/model_thread/single_row.py).

A lone row decodes on the single-row path, speculation on or off: the
batch costs a lone row about a tenth of each step (its per-row offsets
and masks), which a step that proposes nothing, or a row whose acceptance
turned it off, would pay for nothing. So the single-row path verifies a
lone row's proposals itself: one forward pass of its pending token and
its proposal over its own `KVCache` layers, each position sampled in
order with the row's sampler and processors (stages/model_thread/verification.py,
as the batch does), the rejected positions trimmed off. A step that proposes
nothing is the single-row path's own pipelined step.

Whether to propose is decided as in the batch, with the same per-row
policy, drafter and counts (so `/stats` is one figure), but with a gate of
its own: a lone row's plain step is the faster single-row step, which the
batch's measurements for one row do not describe.
Model thread only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import attrs

from stages.model_thread.drafters import only_stepped
from stages.model_thread.greedy_steps import greedy_tokens, normalized
from stages.model_thread.jump_forward import forced_limit, grammar_of
from stages.model_thread.verification import matched, sample_in_order

if TYPE_CHECKING:
    import mlx.core as mx

    from stages.model_thread.speculative_batch import Speculation


def _key(uid: int) -> int:
    """The lone row's key in the shared policy and drafter: negative, never one of the batch's uids."""
    return -1 - uid


@attrs.define
class LoneSpeculation:
    """Proposals for the row running alone, verified over its own cache; see the module's text."""

    speculation: Speculation
    # Accepted and proposed tokens of the row alone, by the single-row path's uid.
    _totals: dict[int, list[int]] = attrs.field(factory=dict, init=False)
    _began: float = attrs.field(default=0.0, init=False)

    def step(self, model: Any, solo: Any) -> list[tuple[int, mx.array]] | None:
        """The tokens the row emits this step, its proposal verified (its pending token first, each with its
        logprobs), its cache cut to them; None: no proposal, the caller takes a plain step (then `plain_step`)."""
        self._began = time.perf_counter()
        # Never past max_tokens: the row's last token comes from the target.
        room = solo.max_tokens - solo.generated - 1
        grammar = grammar_of(solo.processors) if self.speculation.jump_forward is not None else None
        drafting = self.speculation.drafter is not None and self.speculation.lone_gate.speculate(1)
        # Asked before the pending token is read: a row turned off (fresh text) must not wait for it each step.
        budget = self.speculation.policy.budget(_key(solo.uid), 1) if drafting else 0
        if room <= 0 or (grammar is None and budget <= 0):
            # Not even the pending token is read: the plain step stays double-buffered.
            return None
        pending, pending_logprobs = solo.pending
        first = cast(int, pending.item())
        forced = grammar.forced_after(first, min(room, forced_limit(1))) if grammar is not None else []
        drafted = self._drafted(solo, first, forced, min(budget, room - len(forced))) if budget > 0 else []
        proposal = [*forced, *drafted]
        if not proposal:
            return None
        accepted, looked = self._verified(model, solo, first, proposal)
        self._record(solo.uid, len(proposal), accepted, len(forced))
        return [(first, pending_logprobs), *zip(proposal[:accepted], looked[:accepted])]

    def plain_step(self) -> None:
        """The step `step` left to the caller is done: its time is the plain way's."""
        if self.speculation.drafter is not None:
            self.speculation.lone_gate.record(1, False, 1, time.perf_counter() - self._began)

    def _drafted(self, solo: Any, first: int, forced: list[int], size: int) -> list[int]:
        """Up to `size` drafter's tokens after the row's tokens, its pending one `first` and its forced span."""
        drafter = self.speculation.drafter
        assert drafter is not None  # step() asked the gate only with a drafter
        # A span cut at its limit goes on in the grammar, where a drafter's guess would be wasted.
        if size <= 0 or len(forced) >= forced_limit(1):
            return []
        return drafter.propose(_key(solo.uid), [*solo.fed, first, *forced], size)

    def _verified(self, model: Any, solo: Any, first: int, proposal: list[int]) -> tuple[int, list[mx.array]]:
        """How many of `proposal` the row keeps and the logprobs looked at; its cache cut and next token set."""
        import mlx.core as mx

        pending = solo.pending[0]
        logits = model(mx.array([[first, *proposal]]), cache=solo.cache)[0]
        if not solo.processors and _greedy(solo.sampler):
            chosen = cast(list[int], greedy_tokens(logits).tolist())
            accepted = matched(chosen, proposal)
            looked = list(normalized(logits[: accepted + 1]))
            sampled = chosen[accepted]
        else:
            accepted, looked, sampled = sample_in_order(
                logits, pending, proposal, solo.sampler, solo.processors, solo.context
            )
        for layer in solo.cache:
            layer.trim(len(proposal) - accepted)
        solo.pending = (mx.array([sampled], dtype=pending.dtype), looked[accepted])
        return accepted, looked

    def _record(self, uid: int, proposed: int, accepted: int, forced: int) -> None:
        speculation = self.speculation
        speculation.record(_key(uid), proposed, accepted, forced)
        totals = self._totals.setdefault(uid, [0, 0])
        totals[0] += accepted
        totals[1] += proposed
        # The gate weighs the drafter's guesses: a step that took a forced span tells it nothing of them.
        if speculation.drafter is not None and not forced and only_stepped(speculation.drafter, 1):
            speculation.lone_gate.record(1, True, accepted + 1, time.perf_counter() - self._began)

    def finished(self, uid: int) -> tuple[int, int] | None:
        """The row's accepted and proposed tokens as it leaves (None if it never proposed)."""
        self._forget(uid)
        totals = self._totals.pop(uid, None)
        return (totals[0], totals[1]) if totals is not None else None

    def handed_over(self, uid: int, batch_uid: int) -> None:
        """The row moved into the batch as `batch_uid`: its figures go with it."""
        totals = self.finished(uid)
        if totals is not None:
            self.speculation.per_row[batch_uid] = list(totals)

    def _forget(self, uid: int) -> None:
        self.speculation.forget([_key(uid)])


def _greedy(sampler: Any) -> bool:
    from mlx_lm.sample_utils import greedy_sampler

    return sampler is greedy_sampler
