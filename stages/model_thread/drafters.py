"""What a speculating row proposes, and how many tokens it proposes.

Two drafters behind one interface (`Drafter`): prompt lookup, which finds
the row's last few tokens earlier in its own prompt and output and
proposes what followed them there (vLLM's n-gram speculator, no second
model), and a draft model, a smaller model with the target's vocabulary
that proposes its greedy continuation (stages/model_thread/draft_model.py).
Both propose deterministic tokens, so the target's verification
(stages/model_thread/speculative_batch.py) keeps the output distribution
exact.

`RowPolicy` sizes each row's proposal from its acceptance: k doubles after
a fully accepted proposal (a copy that resumed is soon proposed whole:
demo copying code 1.46-1.47x at N=1 and 1.55-1.58x at N=4 against
1.38-1.44x and 1.35-1.51x growing by one) and shrinks to what was
accepted and one more otherwise; a row whose acceptance stays low stops
speculating for a while.
Model thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

# A row speculates again after this many steps off, in case its text changed kind (prose to a quoted block).
_COOLDOWN_STEPS = 64
# Proposed tokens a row's acceptance is judged over before it may be turned off.
_JUDGED_AFTER = 16


class Drafter(Protocol):
    """Proposes up to `k` tokens to follow a row's `history` (every token so far, the pending one last)."""

    name: str
    # Tokens of the rows' histories the last call fed a draft model to catch up (0 for prompt lookup).
    caught_up: int

    def propose(self, uid: int, history: Sequence[int], k: int) -> list[int]: ...

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        """`propose` for each `(uid, history, k)` of one step (a draft model drafts them in one batch)."""
        ...

    def forget(self, uids: Sequence[int]) -> None: ...


def only_stepped(drafter: Drafter, rows: int) -> bool:
    """Whether the last call of `drafter` for `rows` rows was a step's drafting, which the gate times: more than
    two tokens a row caught up is a prefill of their histories, not a step's speed."""
    return drafter.caught_up <= 2 * rows


@attrs.define
class PromptLookup:
    """vLLM's `ngram` speculator: the longest recent n-gram found earlier in the row, and what followed it."""

    max_ngram: int = 3
    min_ngram: int = 1
    name: str = "prompt_lookup"
    caught_up: int = 0

    def propose(self, uid: int, history: Sequence[int], k: int) -> list[int]:
        length = len(history)
        for size in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            tail = list(history[length - size :])
            # The latest earlier occurrence: recent text is the likeliest to be copied on.
            for start in range(length - size - 1, -1, -1):
                if history[start] == tail[0] and list(history[start : start + size]) == tail:
                    return _copied_on(history, length - size - start, k)
        return []

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        return [self.propose(uid, history, k) for uid, history, k in requests]

    def forget(self, uids: Sequence[int]) -> None:
        return None


def _copied_on(history: Sequence[int], distance: int, k: int) -> list[int]:
    """`k` tokens that go on copying what came `distance` tokens earlier, as an overlapping copy does: a match
    just behind the tail (a loop of a few tokens: a repeated word, a run of spaces, a table's rule) has fewer
    than `k` tokens after it, and the loop goes on past them."""
    length = len(history)
    proposal: list[int] = []
    for position in range(length, length + k):
        source = position - distance
        proposal.append(history[source] if source < length else proposal[source - length])
    return proposal


@attrs.define
class _RowState:
    k: int
    proposed: int = 0
    accepted: int = 0
    # Steps left before a row turned off speculates again.
    off_for: int = 0


@attrs.define
class RowPolicy:
    """Per-row k from acceptance, and when a row or the whole batch stops speculating."""

    max_k: int
    # Below this share of proposed tokens accepted, a row stops speculating for a while.
    min_acceptance: float
    # Rows in the batch above which no row speculates: verification costs more than it saves.
    max_rows: int
    _rows: dict[int, _RowState] = attrs.field(factory=dict, init=False)

    def budget(self, uid: int, batch_rows: int) -> int:
        """Tokens the row may propose this step (0: it decodes as usual)."""
        if batch_rows > self.max_rows or self.max_k <= 0:
            return 0
        state = self._rows.setdefault(uid, _RowState(k=self.max_k))
        if state.off_for > 0:
            state.off_for -= 1
            if state.off_for == 0:
                state.proposed = state.accepted = 0
            return 0
        return state.k

    def record(self, uid: int, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        state = self._rows.setdefault(uid, _RowState(k=self.max_k))
        state.proposed += proposed
        state.accepted += accepted
        state.k = min(self.max_k, state.k * 2) if accepted == proposed else max(1, accepted + 1)
        if state.proposed >= _JUDGED_AFTER and state.accepted < self.min_acceptance * state.proposed:
            state.off_for, state.k = _COOLDOWN_STEPS, 1

    def forget(self, uids: Sequence[int]) -> None:
        for uid in uids:
            self._rows.pop(uid, None)


@attrs.define
class DrafterCounts:
    """What one drafter proposed and what the target accepted, since start (vLLM's spec_decode counters)."""

    drafts: int = 0
    proposed: int = 0
    accepted: int = 0
    # Accepted tokens by their place in the proposal (vLLM's num_accepted_tokens_per_pos).
    accepted_per_position: list[int] = attrs.Factory(list)

    def record(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self.drafts += 1
        self.proposed += proposed
        self.accepted += accepted
        if len(self.accepted_per_position) < proposed:
            self.accepted_per_position.extend([0] * (proposed - len(self.accepted_per_position)))
        for position in range(accepted):
            self.accepted_per_position[position] += 1


@attrs.frozen(kw_only=True)
class SpeculationStatistics:
    """`/stats`' speculation figures (vLLM's spec_decode counters, per drafter)."""

    drafter: str
    # Steps in which a row proposed, and its tokens proposed and accepted.
    drafts: int
    proposed_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    accepted_per_position: tuple[int, ...] = ()


# Steps between probes of the way (speculating or not) that is losing, so a change in load is noticed.
_PROBE_EVERY = 48
# Weight of the latest step in a way's running speed.
_SPEED_WEIGHT = 0.2


@attrs.define
class CostGate:
    """Speculates only while it pays: each batch size's measured speed (tokens a second) with and without.

    A verifying pass costs more than a plain step (1 + k positions a row);
    whether the accepted tokens make up for it depends on the machine (on a
    CPU with a slow BLAS a pass costs nearly k + 1 steps) and the load. So
    both ways keep a running speed per batch size, the faster is taken, and
    the slower is probed now and then.
    """

    # Off: every step speculates (tests that must see proposals whatever the machine's speed).
    measured: bool = True
    _speeds: dict[tuple[int, bool], float] = attrs.field(factory=dict, init=False)
    _steps: int = attrs.field(default=0, init=False)

    def speculate(self, rows: int) -> bool:
        if not self.measured:
            return True
        self._steps += 1
        plain, spec = self._speeds.get((rows, False)), self._speeds.get((rows, True))
        if plain is None or spec is None:
            # Learn both: speculate until measured, then a plain step.
            return spec is None
        faster = spec >= plain
        return faster if self._steps % _PROBE_EVERY else not faster

    def record(self, rows: int, speculated: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        speed = tokens / seconds
        key = (rows, speculated)
        held = self._speeds.get(key)
        self._speeds[key] = speed if held is None else held + _SPEED_WEIGHT * (speed - held)
