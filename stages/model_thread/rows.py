"""What the gateway keeps of a row: in the batch, waiting, or preempted and waiting to resume.

A preempted row carries back to the queue what makes its resumption
produce the same tokens: its place in the arrival order, the tokens it
generated (its prompt goes on with them), and its own sampler and
logits processors, already rewound to the last token it returned.
"""

from __future__ import annotations

from typing import Any

import attrs

from pipeline.errors import RequestError
from pipeline.events import FinishReason
from stages.cache.tier import Key
from stages.messages import Abort, Prepared, TokenDelta, TokenScores


@attrs.frozen(kw_only=True)
class Resume:
    """What a preempted row carries back to the queue: its place, its tokens, its sampling state."""

    arrival: int
    generated: tuple[int, ...]
    sampler: Any
    processors: list[Any]
    replaces: Key | None


@attrs.frozen(kw_only=True)
class Waiting:
    prepared: Prepared
    resume: Resume | None = None

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.prepared.prompt_tokens + (self.resume.generated if self.resume else ())


@attrs.define(kw_only=True)
class Row:
    prepared: Prepared
    cached: int
    # The entry this row's conversation continues from: its own entry replaces it.
    replaces: Key | None
    resume: Resume
    generated: list[int] = attrs.Factory(list)

    @property
    def request_id(self) -> str:
        return self.prepared.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.prepared.prompt_tokens)

    @property
    def session(self) -> str | None:
        return self.prepared.params.cache_key

    @property
    def adapter(self) -> str | None:
        return self.prepared.params.adapter

    @property
    def logprobs(self) -> int | None:
        # Alternatives per token to report, when the client asked for logprobs.
        return self.prepared.params.logprobs

    def delta(
        self,
        token: int,
        finish: FinishReason | None,
        scores: tuple[TokenScores, ...] | None,
        speculated: tuple[int, int] | None = None,
    ) -> TokenDelta:
        """The step's token for the sink, with why the row's grammar failed when it failed making it."""
        # stages/model_thread/sampling.py's ConstraintProcessor keeps llguidance's reason in `fault`.
        fault = None
        if self.prepared.constraint is not None:
            fault = next((part.fault for part in self.resume.processors if getattr(part, "fault", None)), None)
        return TokenDelta(
            request_id=self.request_id,
            new_token_ids=(token,),
            finish=finish,
            logprobs=scores,
            grammar_fault=fault,
            speculated=speculated,
        )


@attrs.frozen(kw_only=True)
class Failed:
    """A row that failed on the model thread, for its reply on the event loop."""

    row: Prepared
    error: RequestError


@attrs.frozen(kw_only=True)
class Intake:
    """What one crossing to the event loop brought: aborts, new rows, or the inbox closed."""

    aborts: tuple[Abort, ...]
    admitted: tuple[Prepared, ...]
    closed: bool
