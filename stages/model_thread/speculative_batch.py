"""Speculative decoding inside mlx-lm's continuous batch.

mlx-lm's `BatchGenerator` decodes one token per row per step
(`GenerationBatch`), and `mlx_lm.server` turns batching off to speculate.
`SpeculativeBatch` takes the generation batch's place: in a step where
some rows have proposals (a drafter's, stages/model_thread/drafters.py, or
the tokens a row's grammar forces, stages/model_thread/jump_forward.py, the
forced span first), every row of the batch goes through ONE forward pass of
`1 + K` positions, its pending token then its proposal (right-padded to the
longest), so rows that do not speculate still decode in the same step. A step where no row proposes is mlx-lm's
own, pipelined step.

Verification keeps each row's meaning exactly. The target samples each
position in order with the row's own sampler and logits processors,
exactly as consecutive plain steps would (the same number of sampler and
processor calls, the same context), and a proposed token is accepted only
when it equals the token sampled there. Under greedy that is the exact
match; for a sampled row it is rejection sampling against a point-mass
proposal (accept with p(d), else the residual, which is p without d), so
the distribution is unchanged, and a seeded row draws the same keys in
the same order: the same tokens with speculation on or off. A grammar
masks each position before sampling, so a proposed token it forbids is
never accepted; stop sequences and max_tokens see every emitted token in
order and end the row where they would have.

Rejected positions leave the KV: every layer is cut back to the longest
accepted proposal and the rows that accepted less are rolled right by the
difference (their left padding grows), which is how mlx-lm's batch caches
take right-padded prompts (`prepare(right_padding=...)`, `finalize`). A
finishing row's cache is cut to the tokens it emitted before it goes to
the prompt cache. Plain `KVCache` (and quantized) layers, and sliding-window
ones (`mlx_internals.cut_batch_layer`); models with other layers are refused
at start.

Like quantized_kv.py this module subclasses mlx-lm's batch and so reads
its private fields. Model thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import attrs
import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.sample_utils import greedy_sampler

from stages.model_thread.drafters import (
    CostGate,
    Drafter,
    DrafterCounts,
    RowPolicy,
    SpeculationStatistics,
    only_stepped,
)
from stages.model_thread.greedy_steps import GreedyStepBatch, greedy_tokens, normalized
from stages.model_thread.jump_forward import JumpForward, JumpForwardStatistics, forced_limit, grammar_of
from stages.model_thread.verification import matched, sample_in_order
from stages.models.mlx_internals import cut_batch_layer, cut_layer, in_time_order


@attrs.define
class Speculation:
    """The drafter, the per-row policy, jump-forward, and what was proposed and accepted."""

    # None: no drafter, only the grammars' forced spans are proposed (jump-forward).
    drafter: Drafter | None
    policy: RowPolicy
    counts: DrafterCounts = attrs.Factory(DrafterCounts)
    gate: CostGate = attrs.Factory(CostGate)
    # A row alone speculates on the single-row path (stages/model_thread/lone_speculation.py), whose plain step is
    # faster than the batch's: its speeds are its own.
    lone_gate: CostGate = attrs.Factory(lambda self: CostGate(measured=self.gate.measured), takes_self=True)
    # Accepted and proposed tokens per uid for the rows now in the batch (the per-request timeline's figure), forced
    # spans included.
    per_row: dict[int, list[int]] = attrs.Factory(dict)
    # The grammars' forced spans (stages/model_thread/jump_forward.py); None: jump-forward is off.
    jump_forward: JumpForward | None = None

    def statistics(self) -> SpeculationStatistics | None:
        """The drafter's figures; None without a drafter."""
        counts = self.counts
        if self.drafter is None:
            return None
        return SpeculationStatistics(
            drafter=self.drafter.name,
            drafts=counts.drafts,
            proposed_tokens=counts.proposed,
            accepted_tokens=counts.accepted,
            accepted_per_position=tuple(counts.accepted_per_position),
            acceptance_rate=counts.accepted / counts.proposed if counts.proposed else 0.0,
            tokens_per_pass=(counts.drafts + counts.accepted) / counts.drafts if counts.drafts else 0.0,
        )

    def jump_forward_statistics(self) -> JumpForwardStatistics | None:
        return self.jump_forward.statistics() if self.jump_forward is not None else None

    def record(self, key: int, proposed: int, accepted: int, forced: int) -> None:
        """A row's verified proposal: `forced` forced tokens, then the drafter's; `accepted` of them kept."""
        if self.jump_forward is not None:
            self.jump_forward.record(forced, accepted)
        drafted = proposed - forced
        # A drafter's tokens behind a forced token the verifier dropped were never judged.
        if drafted > 0 and accepted >= forced:
            self.policy.record(key, drafted, accepted - forced)
            self.counts.record(drafted, accepted - forced)

    def forget(self, keys: Sequence[int]) -> None:
        if self.drafter is not None:
            self.drafter.forget(keys)
        self.policy.forget(keys)


@dataclass
class SpeculativeResponse(GenerationBatch.Response):
    """mlx-lm's response, with a finishing row's accepted and proposed tokens (the per-request figure)."""

    speculated: tuple[int, int] | None = None


class SpeculativeBatch(GreedyStepBatch):
    """mlx-lm's GenerationBatch whose steps verify the rows' proposals; see the module's text."""

    speculation: Speculation

    def filter(self, keep: list[int]) -> None:
        kept = set(keep)
        gone = [uid for index, uid in enumerate(self.uids) if index not in kept]
        super().filter(keep)
        self.speculation.forget(gone)
        for uid in gone:
            # A finished row's figures were taken for its response; these rows left otherwise (abort, preemption).
            self.speculation.per_row.pop(uid, None)

    def next(self) -> list[Any]:
        if not self.uids:
            return []
        rows, speculation = len(self.uids), self.speculation
        began = time.perf_counter()
        forced = self._forced()
        gated = speculation.drafter is not None and speculation.gate.speculate(rows)
        proposals = self._proposals(forced, drafting=gated)
        if proposals is not None:
            responses = self._verify(proposals, forced)
        else:
            finishing = dict(speculation.per_row)
            responses = [_told(response, finishing) for response in super().next()]
        # The gate weighs the drafter's guesses: a step that took forced spans tells it nothing of them.
        drafter = speculation.drafter
        if drafter is not None and forced is None and (proposals is None or only_stepped(drafter, rows)):
            speculation.gate.record(rows, proposals is not None, len(responses), time.perf_counter() - began)
        return responses

    def _forced(self) -> list[list[int]] | None:
        """Each row's forced span (jump-forward); None where no row's grammar forces a token."""
        if self.speculation.jump_forward is None or not self.logits_processors:
            return None
        grammars = [grammar_of(processors) for processors in self.logits_processors]
        if not any(grammar is not None for grammar in grammars):
            # Rows without a grammar never wait for the pending tokens here: the batch's step stays pipelined.
            return None
        pending = cast(list[int], self._next_tokens.tolist())
        limit = forced_limit(len(self.uids))
        spans = [
            grammar.forced_after(pending[index], min(limit, self._room(index))) if grammar is not None else []
            for index, grammar in enumerate(grammars)
        ]
        return spans if any(spans) else None

    def _room(self, index: int) -> int:
        """Tokens the row may propose: never past max_tokens, as the row's last token comes from the target."""
        return self.max_tokens[index] - self._num_tokens[index] - 1

    def _proposals(self, forced: list[list[int]] | None, *, drafting: bool) -> list[list[int]] | None:
        """Each row's proposal: its forced span, then its drafter's tokens; None where no row proposes."""
        if forced is None and not drafting:
            return None
        spans = forced or [[] for _ in self.uids]
        drafted = self._drafted(spans) if drafting else {}
        proposals = [[*span, *drafted.get(index, [])] for index, span in enumerate(spans)]
        return proposals if any(proposals) else None

    def _drafted(self, spans: list[list[int]]) -> dict[int, list[int]]:
        """The drafter's tokens by row, each following the row's forced span (a span cut at its limit goes on
        in the grammar, where a drafter's guess would be wasted)."""
        policy, drafter = self.speculation.policy, self.speculation.drafter
        assert drafter is not None  # next() asked the gate only with a drafter
        budgets = [policy.budget(uid, len(self.uids)) for uid in self.uids]
        if not any(budgets):
            return {}
        pending = cast(list[int], self._next_tokens.tolist())
        limit = forced_limit(len(self.uids))
        requests: dict[int, tuple[int, list[int], int]] = {}
        for index, (uid, budget) in enumerate(zip(self.uids, budgets)):
            span = spans[index]
            size = min(budget, self._room(index) - len(span))
            if size > 0 and len(span) < limit:
                requests[index] = (uid, [*self.tokens[index], pending[index], *span], size)
        return dict(zip(requests, drafter.propose_many(list(requests.values())))) if requests else {}

    def _verify(self, proposals: list[list[int]], forced: list[list[int]] | None) -> list[Any]:
        pending = cast(list[int], self._next_tokens.tolist())
        width = max(len(p) for p in proposals)
        rows = [[pending[i], *p, *[pending[i]] * (width - len(p))] for i, p in enumerate(proposals)]
        in_time_order(self.prompt_cache)
        logits = self.model(mx.array(rows), cache=self.prompt_cache)
        emitted: list[list[int]] = []
        emitted_logprobs: list[list[mx.array]] = []
        next_tokens: list[int] = []
        next_logprobs: list[mx.array] = []
        # Greedy rows without processors have no state to keep in step: all their positions at once, in one read, and
        # their log-probabilities only where read (stages/model_thread/greedy_steps.py).
        logprobs_all = normalized(logits)
        chosen_all = cast(list[list[int]], greedy_tokens(logits).tolist())
        for index, proposal in enumerate(proposals):
            if self._plain_greedy(index):
                accepted = matched(chosen_all[index], proposal)
                sampled = chosen_all[index][accepted]
                logprobs = list(logprobs_all[index, : accepted + 1])
            else:
                accepted, logprobs, sampled = self._verify_row(index, logits[index], proposal)
            tokens = [pending[index], *proposal[:accepted]]
            emitted.append(tokens)
            emitted_logprobs.append([self._next_logprobs[index], *logprobs[:accepted]])
            next_tokens.append(sampled)
            next_logprobs.append(logprobs[accepted])
            self.tokens[index].extend(tokens)
            self._record(self.uids[index], len(proposal), accepted, len(forced[index]) if forced else 0)
        self._cut(width, [len(tokens) - 1 for tokens in emitted])
        self._next_tokens = mx.array(next_tokens, dtype=self._next_tokens.dtype)
        self._next_logprobs = next_logprobs
        return self._responses(emitted, emitted_logprobs)

    def _sampler(self, index: int) -> Any:
        return self.samplers[index] if self.samplers and self.samplers[index] is not None else self.fallback_sampler

    def _plain_greedy(self, index: int) -> bool:
        return not (self.logits_processors and self.logits_processors[index]) and self._sampler(index) is greedy_sampler

    def _verify_row(self, index: int, logits: mx.array, proposal: list[int]) -> tuple[int, list[mx.array], int]:
        """Tokens of `proposal` the target accepts, the logprobs of each position looked at, and the next token."""
        processors = self.logits_processors[index] if self.logits_processors else None
        context = self._token_context[index] if processors else None
        first = self._next_tokens[index : index + 1]
        return sample_in_order(logits, first, proposal, self._sampler(index), processors, context)

    def _record(self, uid: int, proposed: int, accepted: int, forced: int) -> None:
        speculation = self.speculation
        speculation.record(uid, proposed, accepted, forced)
        if proposed:
            totals = speculation.per_row.setdefault(uid, [0, 0])
            totals[0] += accepted
            totals[1] += proposed

    def _cut(self, width: int, accepted: Sequence[int]) -> None:
        """Drop the rejected positions from every layer: cut to the longest accepted, roll the rest right."""
        longest = max(accepted)
        shifts = [longest - count for count in accepted]
        for layer in self.prompt_cache:
            cut_batch_layer(layer, width - longest, shifts)

    def _responses(self, emitted: list[list[int]], logprobs: list[list[mx.array]]) -> list[Any]:
        keep, responses = [], []
        for index, tokens in enumerate(emitted):
            finish = None
            for place, token in enumerate(tokens):
                self._num_tokens[index] += 1
                if self._num_tokens[index] >= self.max_tokens[index]:
                    finish = "length"
                if self._matchers[index].advance(token):
                    finish = "stop"
                cache, all_tokens = None, None
                if finish is not None:
                    # The cache holds every emitted token; a row that ends early keeps only those up to its end.
                    extra = len(tokens) - 1 - place
                    cache = self.extract_cache(index)
                    all_tokens = self.tokens[index][: len(self.tokens[index]) - extra]
                    if extra:
                        held = len(self.tokens[index])
                        cut = [cut_layer(layer, held - extra, held) for layer in cache]
                        # A sliding-window layer past its window cannot be cut: the row's KV is not kept.
                        cache = None if any(layer is None for layer in cut) else cut
                uid = self.uids[index]
                totals = self.speculation.per_row.pop(uid, None) if finish is not None else None
                speculated = (totals[0], totals[1]) if totals is not None else None
                responses.append(
                    SpeculativeResponse(uid, token, logprobs[index][place], finish, cache, all_tokens, speculated)
                )
                if finish is not None:
                    break
            if finish is None:
                keep.append(index)
        if len(keep) < len(self.uids):
            self.filter(keep)
        return responses


def _told(response: Any, totals: dict[int, list[int]]) -> Any:
    """A finishing row's response from a plain step, with what it accepted while it speculated."""
    if response.finish_reason is None or response.uid not in totals:
        return response
    accepted, proposed = totals[response.uid]
    fields = {name: getattr(response, name) for name in response.__dataclass_fields__}
    return SpeculativeResponse(**fields, speculated=(accepted, proposed))


def speculating(make: Callable[[], Any], speculation: Speculation | None) -> Callable[[], Any]:
    """`make` (a BatchGenerator factory) whose generators' generation batch speculates, or where `speculation` is
    None only takes greedy rows' tokens without normalizing them (stages/model_thread/greedy_steps.py)."""

    def build() -> Any:
        generator = make()
        if speculation is None:
            generator._generation_batch = GreedyStepBatch.empty(generator.model, generator.sampler)
            return generator
        batch = SpeculativeBatch.empty(generator.model, generator.sampler)
        batch.speculation = speculation
        generator._generation_batch = batch
        return generator

    return build
