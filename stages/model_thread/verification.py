"""A proposal checked against the target's own sampling: the positions sampled in order, the first mismatch ends it.

Shared by the batch's verification (stages/model_thread/speculative_batch.py)
and a lone row's (stages/model_thread/lone_speculation.py). Model thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from stages.model_thread.greedy_steps import normalized, sampled_from

if TYPE_CHECKING:
    import mlx.core as mx


def sample_in_order(
    logits: mx.array, first: mx.array, proposal: Sequence[int], sampler: Any, processors: Any, context: Any
) -> tuple[int, list[mx.array], int]:
    """How many of `proposal` the target accepts, the logprobs of each position looked at, and the next token.

    `logits` holds one row's positions (`first`, the pending token, then the
    proposal); each is processed and sampled in order, as consecutive plain
    steps would, and the first proposed token that differs from the one
    sampled at its place ends the proposal. `context` is the row's processor
    context (a `TokenBuffer`), fed the tokens whose logits are looked at.
    """
    import mlx.core as mx

    context_tokens = [first, *(mx.array([token]) for token in proposal)]
    looked: list[mx.array] = []
    for position in range(len(proposal) + 1):
        row_logits = logits[position : position + 1]
        if processors:
            fetched = context.update_and_fetch(context_tokens[position])
            for processor in processors:
                row_logits = processor(fetched, row_logits)
        # Drawn as the batch's step draws (greedy_steps.py), the log-probabilities lazy unless the sampler needs them.
        logprobs = normalized(row_logits)
        token = cast(int, sampled_from(row_logits, logprobs, sampler).item())
        looked.append(logprobs[0])
        if position == len(proposal) or token != proposal[position]:
            return position, looked, token
    raise AssertionError("unreachable: the last position always returns")


def matched(chosen: Sequence[int], proposal: Sequence[int]) -> int:
    """How many of `proposal` the target's own choices repeat, from the start."""
    accepted = 0
    while accepted < len(proposal) and chosen[accepted] == proposal[accepted]:
        accepted += 1
    return accepted
