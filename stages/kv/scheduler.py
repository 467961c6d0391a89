"""The batch's KV account: which waiting row may start, which running row must yield.

mlx-lm's BatchKVCache pads every row to the longest, so n rows hold
`n x kv_bytes(longest)`: the account is kept per row (prompt plus what it
generated so far) and priced as the batch lays it out, in whole cache
blocks, not as prompt + max_tokens reserved up front.

The policy follows vLLM's scheduler: first come, first served; a waiting
row starts only if the batch, with it, still fits with one more block of
growth for every row (so a row admitted now is not preempted at the next
block boundary); when the running rows' next step would not fit, the row
that arrived last is preempted (recompute preemption: its KV is handed to
the prompt cache, and it resumes from there, or recomputes, at the head
of the queue). A resumed row keeps its place in the arrival order.

Idle rows (Batch API lines, `GenerationParams.idle`) run in what live rows
leave: they are preempted before any live row, latest arrival first, and a
live row that waits for memory has idle rows preempted to make its room
(`room_for`). Model thread only; the published totals are plain ints.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from stages.kv.shape import BLOCK, ModelShape


@attrs.define
class KvScheduler:
    shape: ModelShape
    budget_bytes: int
    # uid -> (arrival, tokens held, idle); idleness then arrival orders victims.
    _rows: dict[int, tuple[int, int, bool]] = attrs.field(factory=dict, init=False)
    _arrivals: int = attrs.field(default=0, init=False)
    held_bytes: int = attrs.field(default=0, init=False)
    preemptions: int = attrs.field(default=0, init=False)
    resumed: int = attrs.field(default=0, init=False)

    def batch_bytes(self, lengths: Iterable[int]) -> int:
        """What rows of these lengths hold together, padded to the longest."""
        held = list(lengths)
        return len(held) * self.shape.kv_bytes(max(held)) if held else 0

    def can_admit(self, tokens: int) -> bool:
        return self._admits(tokens, self._rows)

    def _admits(self, tokens: int, uids: Iterable[int]) -> bool:
        lengths = [self._rows[uid][1] for uid in uids] + [tokens]
        return self.batch_bytes(n + BLOCK for n in lengths) <= self.budget_bytes

    def arrive(self) -> int:
        """A new request's place in the arrival order."""
        self._arrivals += 1
        return self._arrivals

    def admit(self, uid: int, tokens: int, arrival: int, *, idle: bool = False) -> None:
        self._rows[uid] = (arrival, tokens, idle)
        self._publish()

    def advance(self, uid: int, tokens: int = 1) -> None:
        arrival, held, idle = self._rows[uid]
        self._rows[uid] = (arrival, held + tokens, idle)

    def release(self, uid: int) -> None:
        if self._rows.pop(uid, None) is not None:
            self._publish()

    def victims(self) -> list[int]:
        """Rows to preempt, idle rows first and then live ones, each latest arrival first, until every other
        row's next step fits; never the last row."""
        order = self._by_precedence()
        chosen: list[int] = []
        while len(order) > 1 and self.batch_bytes(self._rows[uid][1] + 1 for uid in order) > self.budget_bytes:
            chosen.append(order.pop())
        return chosen

    def room_for(self, tokens: int) -> list[int]:
        """Idle rows to preempt, latest arrival first, so a waiting live row of `tokens` is admitted; empty when
        it is admitted already, or when preempting every idle row would not make room (it waits as it did)."""
        order = self._by_precedence()
        chosen: list[int] = []
        while order and self._rows[order[-1]][2] and not self._admits(tokens, order):
            chosen.append(order.pop())
        # With no row left, it runs alone, as any row may (preparation refused those that cannot fit alone).
        return chosen if not order or self._admits(tokens, order) else []

    def _by_precedence(self) -> list[int]:
        """The rows, those to keep longest first: live before idle, earlier arrival before later."""
        return sorted(self._rows, key=lambda uid: (self._rows[uid][2], self._rows[uid][0]))

    def settle(self) -> None:
        """Publish the account after a step."""
        self._publish()

    def _publish(self) -> None:
        self.held_bytes = self.batch_bytes(held for _, held, _ in self._rows.values())
