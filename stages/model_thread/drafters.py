"""What a speculating row proposes, and how many tokens it proposes.

Two drafters behind one interface (`Drafter`): prompt lookup, which finds
the row's last few tokens earlier in its own prompt and output and
proposes what followed them there (vLLM's n-gram speculator, no second
model), and a draft model, a smaller model with the target's vocabulary
that proposes its greedy continuation (stages/model_thread/draft_model.py).
Both propose deterministic tokens, so the target's verification
(stages/model_thread/speculative_batch.py) keeps the output distribution
exact.

`RowPolicy` sizes each row's proposal from its acceptance: k starts at 2
and doubles after a fully accepted proposal (a copy that resumed is soon proposed whole:
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
# A row's first k: where nothing is copied (fresh text) the first proposal is rejected, and a pass of 3 positions
# costs less than one of 9; a copy doubles k to the most in two passes (the copy-heavy edit replayed through the
# drafter: 152 passes from 2, 151 from 8). SmolLM2 writing fresh text at N=4 lost 5% starting at 8.
_FIRST_K = 2


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

    # Up to 8 tokens matched, not 3: in code a 3-gram (`    lines.append(`, `item.on_hand`) recurs in many places
    # and its latest occurrence is often the wrong one. A faithful rewrite of bench/speculation_edit.py's file,
    # replayed through the drafter and each row's k: 4.26 tokens per verifying pass at 3, 7.22 at 6, 7.70 at 8,
    # 7.96 at 12 (SmolLM2's tokens; Gemma 3's alike).
    max_ngram: int = 8
    min_ngram: int = 1
    name: str = "prompt_lookup"
    caught_up: int = 0

    def propose(self, uid: int, history: Sequence[int], k: int) -> list[int]:
        size, distance = self.match(history)
        if size < self.min_ngram:
            return []
        return _copied_on(history, distance, k)

    def match(self, history: Sequence[int]) -> tuple[int, int]:
        """The longest n-gram ending the history found earlier in it, as (its length, how far back it ends);
        (0, 0) when the last token occurs nowhere earlier."""
        length = len(history)
        if length < 2:
            return 0, 0
        last, longest = history[-1], self.max_ngram
        best, best_end = 0, -1
        # One pass from the latest earlier token back: each occurrence of the last token is the end of a match,
        # measured backwards; the longest wins, the latest among equals (recent text is the likeliest copied on).
        for end in range(length - 2, -1, -1):
            if history[end] != last:
                continue
            size = 1
            while size < longest and size <= end and history[end - size] == history[length - 1 - size]:
                size += 1
            if size > best:
                best, best_end = size, end
                if size == longest:
                    break
        return (best, length - 1 - best_end) if best else (0, 0)

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
        state = self._rows.setdefault(uid, _RowState(k=min(_FIRST_K, self.max_k)))
        if state.off_for > 0:
            state.off_for -= 1
            if state.off_for == 0:
                state.proposed = state.accepted = 0
            return 0
        return state.k

    def record(self, uid: int, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        state = self._rows.setdefault(uid, _RowState(k=min(_FIRST_K, self.max_k)))
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
    # Tokens a row emits per verifying pass of the target over its proposal, its pending token and the accepted
    # ones: (drafts + accepted) / drafts, 0.0 before the first. Unlike a speed it does not depend on the machine.
    tokens_per_pass: float = 0.0


# Steps of each way a batch size measures before the gate chooses between them: one step says little, as a
# proposal's acceptance varies from step to step and a shared machine's speed from moment to moment (SmolLM2's
# copy-heavy edit: the first proposal of a reply, 1 of 8 accepted, kept prompt lookup off for 47 steps of 48).
_LEARN_STEPS = 4
# Steps between probes of the way (speculating or not) that is losing, so a change in load is noticed.
_PROBE_EVERY = 32
# Weight of the latest step in a way's running tokens and seconds, once it has been learned.
_STEP_WEIGHT = 0.1


@attrs.define
class _Way:
    """One way's running tokens and seconds a step: its speed is their ratio (a mean of per-step speeds would weigh
    a one-token step's speed as much as a nine-token step's)."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.steps += 1
        # The plain mean while learning, then a running one.
        weight = max(1 / self.steps, _STEP_WEIGHT)
        self.tokens += weight * (tokens - self.tokens)
        self.seconds += weight * (seconds - self.seconds)

    @property
    def speed(self) -> float:
        return self.tokens / self.seconds


@attrs.define
class CostGate:
    """Speculates only while it pays: each batch size's measured speed (tokens a second) with and without.

    A verifying pass costs more than a plain step (1 + k positions a row);
    whether the accepted tokens make up for it depends on the machine (on a
    CPU a pass of 9 positions costs SmolLM2 several plain steps, most of it
    the output projection over every position) and the load. So both ways
    keep a running speed per batch size, learned over a few steps each
    first, the faster is taken, and the slower is probed now and then.
    """

    # Off: every step speculates (tests that must see proposals whatever the machine's speed).
    measured: bool = True
    _ways: dict[tuple[int, bool], _Way] = attrs.field(factory=dict, init=False)
    _steps: int = attrs.field(default=0, init=False)

    def speculate(self, rows: int) -> bool:
        if not self.measured:
            return True
        self._steps += 1
        plain, spec = self._way(rows, False), self._way(rows, True)
        if plain.steps < _LEARN_STEPS or spec.steps < _LEARN_STEPS:
            # Learn both, in turns: speculate first.
            return spec.steps <= plain.steps
        faster = spec.speed >= plain.speed
        return faster if self._steps % _PROBE_EVERY else not faster

    def record(self, rows: int, speculated: bool, tokens: int, seconds: float) -> None:
        if seconds > 0:
            self._way(rows, speculated).add(tokens, seconds)

    def _way(self, rows: int, speculated: bool) -> _Way:
        return self._ways.setdefault((rows, speculated), _Way())
