"""Jump-forward decoding: the tokens a row's grammar forces, taken in one verifying pass instead of a step each.

Where a row's grammar admits exactly one continuation (a forced call's
markup and name, a JSON schema's keys and punctuation, a `const`, an enum
down to one member), llguidance names those tokens
(`LLMatcher.compute_ff_tokens`, through `ConstraintProcessor.forced_after`
in stages/model_thread/sampling.py). They are proposed as a drafter's
tokens are, ahead of any drafter's (stages/model_thread/speculative_batch.py,
stages/model_thread/lone_speculation.py), and verified the same way: each
position sampled in order with the row's own sampler and processors, the
grammar's mask among them, a token kept only where it equals the one
sampled there. So the output is the step-by-step output, token for token;
where llguidance's canonical tokenization of the forced text differs from
the token the model picks (`"name"` as one token or two), the verifier keeps
the model's and drops the rest of the span, and the next step asks the
grammar again from there (docs/speculative-decoding.md).

A forced span is not a guess: it skips the drafters' acceptance policy and
the measured gate, which judge guesses. Takes in a row's processors and its
pending token; gives out the span; owns the forced-span counts (`/stats`'
`gateway.jump_forward`). Model thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from stages.model_thread.sampling import ConstraintProcessor

# The longest span one pass takes: a forced call's markup, name and one-member enums fit (harmony's whole forced
# call is 34 tokens of the demo vocabulary); a longer span goes on in the next step.
MAX_FORCED = 32
# Extra positions a verifying pass may give forced spans across the batch: every row is padded to the widest
# proposal, so a wide span in a large batch costs each row its width. 128 keeps the whole 32 up to 4 rows, and
# at least 2 tokens a step in any batch.
_PASS_POSITIONS = 128


def forced_limit(rows: int) -> int:
    """The most forced tokens a row of a batch of `rows` rows proposes in one pass."""
    return max(2, min(MAX_FORCED, _PASS_POSITIONS // max(1, rows)))


def grammar_of(processors: Sequence[object] | None) -> ConstraintProcessor | None:
    """The row's grammar among its logits processors, if it has one."""
    from stages.model_thread.sampling import ConstraintProcessor

    return next((p for p in processors or () if isinstance(p, ConstraintProcessor)), None)


@attrs.frozen(kw_only=True)
class JumpForwardStatistics:
    """`/stats`' `gateway.jump_forward`: forced spans proposed, and the tokens of them the rows took."""

    # Row-steps that proposed a forced span.
    spans: int
    forced_tokens: int
    # Forced tokens the verifier kept: each is a decode step the row did not take.
    accepted_tokens: int


@attrs.define
class JumpForward:
    """What the rows' grammars forced and what the verifier kept, since start."""

    spans: int = 0
    forced: int = 0
    accepted: int = 0

    def record(self, forced: int, accepted: int) -> None:
        """A row's pass proposed `forced` forced tokens and kept `accepted` of its proposal's tokens."""
        if forced <= 0:
            return
        self.spans += 1
        self.forced += forced
        self.accepted += min(forced, accepted)

    def statistics(self) -> JumpForwardStatistics:
        return JumpForwardStatistics(spans=self.spans, forced_tokens=self.forced, accepted_tokens=self.accepted)
