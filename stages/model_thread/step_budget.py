"""A step's time budget: how many prompt tokens the next step may prefill, from the measured speeds.

A step of the batch (mlx-lm's `BatchGenerator.next`) decodes one token for
every decoding row and then prefills one chunk of each prefilling row's
prompt, up to `prefill_step_size` tokens a row. A fixed chunk makes the
step's length depend on the model and the machine: 512 tokens for each of
several prompts takes seconds on a CPU, and every stream stalls, and no
abort is seen, until the step ends. vLLM bounds a step by tokens
(`max_num_batched_tokens`: the decoding rows' tokens first, then prefill
chunks fill what is left); this bounds it by time as well.

Before each step the gateway asks `chunk` for the prompt tokens a
prefilling row may take. The target holds a prefill back only for the sake
of something that waits on the step: rows decoding, or exclusive work
queued. With neither, a prompt prefills in full `max_chunk` chunks (the
`prefill_step_size` setting), so an abort or a new row waits at most one
such chunk; a lone prompt cut to the target's size would only prefill
slower (SmolLM2 on two cores: 16-token chunks, about 1.6x the time of full
ones), since a small chunk costs more a token. Otherwise the chunk is what
the target leaves after the decoding rows' share, at the measured prefill
speed, divided among the rows that prefill together, between `min_chunk`
(so a prompt always progresses, even when decoding alone fills the step)
and `max_chunk`. After it, `record` takes the step's length
and what it did, and updates two running estimates: a step's length with no
prefill, and the seconds a prompt token costs beside it (both smoothed, so
one slow step moves them a little; a prefill slows as its context grows,
and the estimate follows). The first chunk, before any prefill was
measured, is `first_chunk` tokens: small, so the first measurement cannot
overrun the target by much.

With `decode_ratio` (the default, `MLX_RELAY_STEP_BUDGET_RATIO`, 2) a step
beside decoding rows aims at that multiple of their decode-only step, and
never below `target_s`. A fixed target starves a prompt exactly when the
machine is busiest: once the decoding rows alone take the target, each step
prefills `min_chunk` tokens, and on a compute-bound CPU the prompt's time
to its first token grows as 1 / (the step's prefill share) while the
streams' gap grows only as 1 / (1 - that share). Aiming at twice the
decode-only step splits each step evenly: the streams' gap stays near twice
its idle value, and the prompt gets half the machine however many rows
decode (docs/step-budget.md, "Sized to the decode step"). Where more rows
wait for their first token than decode (a burst of requests beside a few
streams), the prompts' share is theirs by count instead: each waiting row,
prompt or stream, gets an equal share of the step. Holding 14 new prompts
to 16-token chunks for the sake of one stream stretched 14 TTFTs, took a
decode pass a chunk, and kept that one stream's gap past its target anyway.

Pure arithmetic, no MLX: tests drive it by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

# Each measurement's weight in the running estimates.
_SMOOTHING = 0.3


@attrs.define
class StepBudget:
    target_s: float
    max_chunk: int
    # Beside decoding rows, the step aims at this multiple of their decode-only step (at least `target_s`); 0: a
    # fixed `target_s`.
    decode_ratio: float = 0.0
    min_chunk: int = 16
    first_chunk: int = 64
    # A step's length with rows decoding and nothing prefilling; seconds per prompt token beside them.
    _decode_s: float | None = attrs.field(default=None, init=False)
    _token_s: float | None = attrs.field(default=None, init=False)
    # Each prefilling row's progress at the last step (the batch's own count), to tell what one step prefilled.
    _progress: dict[int, int] = attrs.field(factory=dict, init=False)
    # The rows the last `chunk` was asked for: `record` judges the step against the target they were given.
    _prefilling: int = attrs.field(default=0, init=False)
    # The chunks asked for, and the steps that went past the target, for /stats.
    chunks: int = attrs.field(default=0, init=False)
    last_chunk: int = attrs.field(default=0, init=False)
    over_target: int = attrs.field(default=0, init=False)

    def chunk(self, *, prefilling: int, decoding: int, other_work: bool = False, longest: int = 0) -> int:
        """Prompt tokens each of `prefilling` rows may take in the next step, beside `decoding` rows and,
        with `other_work`, exclusive work waiting for the step to end; `longest`, where known, the most prompt
        tokens any of those rows has left to prefill (at most: a row part-way through may have fewer)."""
        self._prefilling = max(prefilling, 0)
        if prefilling <= 0:
            return self.max_chunk
        if not decoding and not other_work:
            size = self.max_chunk
        elif self._token_s is None:
            size = self.first_chunk
        else:
            decode = self._decode_s if decoding and self._decode_s is not None else 0.0
            target = self.target(decoding=decoding, prefilling=prefilling)
            size = int((target - decode) / self._token_s / prefilling)
        self.chunks += 1
        self.last_chunk = max(self.min_chunk, min(self.max_chunk, size))
        # Prompts that end within two chunks end in this step: each pass over the weights costs what many prompt
        # tokens do, and a short tail chunk would pay for one (SmolLM2's 25-token chat prompts, cut 16 + 8, cost the
        # relay 12% more CPU a token at N=16 than whole prompts did).
        if 0 < longest <= 2 * self.last_chunk:
            self.last_chunk = min(self.max_chunk, max(self.last_chunk, longest))
        return self.last_chunk

    def record(self, seconds: float, prefilled: Sequence[Any], *, decoding: int, other_work: bool = False) -> None:
        """One step took `seconds`, with `decoding` rows decoding and the batch's prefill responses `prefilled`;
        `other_work` as `chunk` was told it."""
        tokens = self._prefilled_tokens(prefilled)
        if tokens == 0 and decoding:
            self._decode_s = _smoothed(self._decode_s, seconds)
        elif tokens:
            decode = self._decode_s if decoding and self._decode_s is not None else 0.0
            self._token_s = _smoothed(self._token_s, max(seconds - decode, 0.0) / tokens)
        # A step that kept nobody waiting (a prompt prefilling alone, in full chunks) had no target to meet; one that
        # kept rows or exclusive work waiting had, as `chunk` sized it (a decode-only step's own length counts in a
        # target that follows it).
        if seconds > self.target(decoding=decoding, prefilling=self._prefilling) and (
            decoding or other_work or not tokens
        ):
            self.over_target += 1

    def target(self, *, decoding: int, prefilling: int = 1) -> float:
        """The seconds a step beside `decoding` rows aims at, with `prefilling` rows taking a chunk in it."""
        if decoding and self.decode_ratio and self._decode_s is not None:
            # Where the prompts outnumber the streams each waiting row gets an equal share: the streams' part of the
            # step is decoding / (prefilling + decoding) of it.
            return max(self.target_s, self._decode_s * max(self.decode_ratio, (prefilling + decoding) / decoding))
        return self.target_s

    def _prefilled_tokens(self, prefilled: Sequence[Any]) -> int:
        # `progress` is (prompt tokens sent to the model so far, the prompt's length) for each row still prefilling;
        # rebuilt every step, so a row that left (finished, aborted, preempted) leaves nothing behind.
        progress = {int(r.uid): int(r.progress[0]) for r in prefilled if not r.end_of_prompt}
        tokens = sum(done - self._progress.get(uid, 0) for uid, done in progress.items())
        self._progress = progress
        return max(tokens, 0)


def _smoothed(estimate: float | None, measured: float) -> float:
    return measured if estimate is None else (1 - _SMOOTHING) * estimate + _SMOOTHING * measured
