"""Per-row samplers and logits processors, built from mlx-lm's parts.

Every sampled row owns its random key, split once per step, so a seeded
request gives the same tokens whatever else shares the batch (mlx-lm's
server reseeds the global generator instead and so cannot batch seeded
requests). Greedy rows share mlx-lm's `greedy_sampler`, which lets the
batch sample them in one call. Runs on the gateway's model thread only.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, cast

import mlx.core as mx
import numpy as np
from mlx_lm.generate import StopSequences
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler, make_logits_processors

from pipeline.requests import GenerationParams, Sampling
from stages.messages import Prepared

if TYPE_CHECKING:
    from llguidance import LLMatcher

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


class KeyedSampler:
    """Temperature sampling with top-p / min-p / top-k, from the row's own key."""

    def __init__(self, sampling: Sampling) -> None:
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        self._key = mx.random.key(seed % 2**64)
        self._calls = 0
        # The key before the latest call: mlx-lm samples one token ahead of what it returns.
        self._before: tuple[int, mx.array] | None = None
        self._inverse_temperature = 1.0 / sampling.temperature
        # Temperature, min-p, top-k and the categorical draw look only at differences between a row's values, so
        # they take its logits as they are: the normalization over the vocabulary costs more than the draw on a CPU
        # (stages/model_thread/greedy_steps.py). Typical-p's entropy is the probabilities', and top-p's masses are
        # exponentials that raw logits past 88 would overflow: those take log-probabilities.
        self.takes_logits = sampling.typical_p >= 1.0 and not 0.0 < sampling.top_p < 1.0
        self._filters: list[Callable[[mx.array], mx.array]] = []
        if sampling.typical_p < 1.0:
            # First, like HF's warpers: the entropy is the whole distribution's.
            self._filters.append(lambda x: apply_typical_p(x, sampling.typical_p))
        if 0.0 < sampling.top_p < 1.0:
            self._filters.append(lambda x: apply_top_p(x, sampling.top_p))
        if sampling.min_p > 0.0:
            self._filters.append(lambda x: apply_min_p(x, sampling.min_p, 1))
        if sampling.top_k > 0:
            # mlx-lm refuses a k as large as the vocabulary; such a k keeps everything.
            self._filters.append(lambda x: apply_top_k(x, sampling.top_k) if sampling.top_k < x.shape[-1] else x)

    def __call__(self, logprobs: mx.array) -> mx.array:
        """A token from `logprobs`, or from the row's logits where `takes_logits`."""
        self._before = (self._calls, self._key)
        self._calls += 1
        self._key, step_key = mx.random.split(self._key)
        for keep in self._filters:
            logprobs = keep(logprobs)
        return mx.random.categorical(logprobs * self._inverse_temperature, key=step_key)

    def rewind(self, calls: int) -> None:
        """Back to the key after `calls` calls, for a preempted row that resumes.

        mlx-lm has sampled one token past the last one it returned; the
        resumed row samples that token again, from the same key.
        """
        if calls == self._calls:
            return
        if self._before is None or self._before[0] != calls:
            raise ValueError(f"cannot rewind a sampler from {self._calls} calls to {calls}")
        self._calls, self._key = self._before
        self._before = None


def apply_typical_p(logprobs: mx.array, mass: float) -> mx.array:
    """Locally typical sampling (Meister et al. 2022): keep the tokens whose
    surprise is closest to the distribution's entropy, as few as hold `mass`.

    mlx-lm has no typical sampler; this follows HF's `TypicalLogitsWarper`.
    The most typical token always stays.
    """
    finite = mx.isfinite(logprobs)
    probs = mx.where(finite, mx.exp(logprobs), 0.0)
    entropy = -mx.sum(mx.where(finite, probs * logprobs, 0.0), axis=-1, keepdims=True)
    gap = mx.where(finite, mx.abs(-logprobs - entropy), mx.inf)
    order = mx.argsort(gap, axis=-1)
    ranked = mx.take_along_axis(probs, order, axis=-1)
    # A token stays when the more typical ones before it hold less than `mass`.
    before = mx.cumsum(ranked, axis=-1) - ranked
    keep = mx.put_along_axis(mx.zeros(logprobs.shape, dtype=mx.bool_), order, before < mass, axis=-1)
    return mx.where(keep, logprobs, mx.array(-mx.inf, dtype=logprobs.dtype))


def make_row_sampler(sampling: Sampling) -> Sampler:
    # top_p 0 keeps only the most likely token: greedy, whatever the temperature.
    if sampling.temperature == 0.0 or sampling.top_p == 0.0:
        return greedy_sampler
    return KeyedSampler(sampling)


def make_row_processors(
    sampling: Sampling,
    max_tokens: int,
    constraint: LLMatcher | None = None,
    budget: ThinkBudget | None = None,
    at_least: MinTokens | None = None,
) -> list[LogitsProcessor]:
    # OpenAI's penalties count every generated token, so the window is the
    # whole completion rather than mlx-lm's default of the last 20.
    window = max(1, max_tokens)
    processors: list[LogitsProcessor] = make_logits_processors(
        logit_bias=dict(sampling.logit_bias) or None,
        repetition_penalty=sampling.repetition_penalty,
        repetition_context_size=window,
        presence_penalty=sampling.presence_penalty,
        presence_context_size=window,
        frequency_penalty=sampling.frequency_penalty,
        frequency_context_size=window,
    )
    if budget is not None:
        processors.append(budget)
    if constraint is not None:
        # After the bias and penalties, so none can lift a forbidden token back up.
        processors.append(ConstraintProcessor(constraint))
    if at_least is not None:
        # After the grammar, which it may only narrow: where the grammar allows nothing but the end, the row ends.
        processors.append(at_least)
    return processors


class ConstraintProcessor:
    """Masks every token the row's grammar forbids (llguidance), per step.

    mlx-lm calls it with the row's tokens so far; from the second call on,
    the last of them is the token sampled at the previous step, which the
    matcher consumes before it computes the next mask. Reading that token
    waits for the step that made it: constrained rows cost the pipeline
    its overlap, free rows in the same batch do not need it.

    llguidance never raises on a limit met mid-generation (a parser row too
    long, the lexer's fuel spent): the matcher enters an error state and
    its masks allow nothing but an end. `fault` keeps its reason, which the
    gateway hands to the sink with the step's token (`stages/model_thread/rows.py`), so the row ends with
    an error rather than with `stop` and text that breaks the grammar.

    The matcher is never rolled back over the token a call will bring: llguidance's rollback (1.9) is not
    exact after a token the grammar names by id (`<[N]>`: the XML call markups' `>` and newline), and
    the matcher then refuses that very token. So a token taken early (`forced_after`, `rewind`) is held,
    and the call that brings it takes nothing more.
    """

    def __init__(self, matcher: LLMatcher) -> None:
        self._matcher = matcher
        self._calls = 0
        self.fault: str | None = None
        # The token the matcher took last, and whether the next call brings it (taken ahead of that call).
        self._last: int | None = None
        self._held = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._calls:
            self._take(cast(int, tokens[-1].item()))
        self._calls += 1
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        if self.fault is None and self._matcher.is_error():
            self.fault = self._matcher.get_error() or "the grammar engine stopped"
        allowed = np.unpackbits(words, bitorder="little")[: logits.shape[-1]].astype(np.bool_)
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))

    def _take(self, token: int) -> None:
        """The matcher takes `token`, the one sampled at the last call, unless it took it ahead."""
        if self._held:
            self._held = False
            if token == self._last:
                return
            # Not the token taken ahead (no caller does this): the inexact rollback is all that is left.
            self._matcher.rollback(1)
        self._matcher.consume_token(token)
        self._last = token

    def forced_after(self, pending: int, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces after `pending`, the token sampled at the last call (jump-forward,
        stages/model_thread/jump_forward.py).

        The matcher takes `pending` now and holds it for the next call, which brings it (the verifying pass's
        first position, or the plain step's token): the masks are those of a step a token.
        Empty before the first call (no token was sampled under this mask), once the matcher is in error, and
        where `pending` does not fit the grammar (`try_consume_tokens` takes nothing then, and leaves no error).
        """
        if not self._calls or limit <= 0 or self._matcher.is_error():
            return []
        if not (self._held and pending == self._last):
            if self._held or not self._matcher.try_consume_tokens([pending]):
                return []
            self._last, self._held = pending, True
        return list(self._matcher.compute_ff_tokens()[:limit])

    def rewind(self, calls: int) -> None:
        """Back to the grammar state after `calls` calls (a preempted row resumes).

        The resumed row brings its last token again: rewound by one call, the matcher holds that token rather
        than roll it back.
        """
        consumed, kept = max(0, self._calls - 1) + self._held, max(0, calls - 1)
        if consumed == kept + 1:
            self._held = True
        elif consumed > kept:
            self._matcher.rollback(consumed - kept)
            self._held = False
        self._calls = calls


def rewind_row(sampler: object, processors: Sequence[object], calls: int) -> None:
    """Put a row's sampler and stateful processors back to `calls` steps; stateless ones need nothing."""
    for part in (sampler, *processors):
        rewind = getattr(part, "rewind", None)
        if rewind is not None:
            rewind(calls)


class MinTokens:
    """vLLM's `min_tokens`: the row's stop tokens cannot be sampled before `count` tokens."""

    def __init__(self, count: int, stop_ids: Sequence[int]) -> None:
        self._count, self._calls = count, 0
        self._stop_ids = mx.array(sorted(stop_ids), dtype=mx.int32)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        # One call per sampled token: the calls so far are the tokens generated.
        generated, self._calls = self._calls, self._calls + 1
        if generated >= self._count or self._stop_ids.size == 0:
            return logits
        banned = mx.zeros(logits.shape[-1:], dtype=logits.dtype)
        banned[self._stop_ids] = -mx.inf
        held = logits + banned
        # Nothing left but the stop tokens (a grammar at its end): the row may end.
        return logits if not mx.any(held > -mx.inf).item() else held

    def rewind(self, calls: int) -> None:
        self._calls = calls


def row_stop_ids(params: GenerationParams, eos_ids: Iterable[int]) -> frozenset[int]:
    """The tokens that end a row: its model's EOS (unless `ignore_eos`) and its `stop_token_ids`."""
    return frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(eos_ids))


class RowStops(StopSequences):
    """mlx-lm's stop automaton that keeps its sequences: a sharded rank 0 sends them to the followers."""

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        super().__init__(sequences)
        self.sequences = [list(sequence) for sequence in sequences]


def row_stop_sequences(params: GenerationParams, eos_ids: Iterable[int]) -> RowStops:
    """`row_stop_ids` as the generator's per-row stop sequences (one token each)."""
    return RowStops([[token] for token in sorted(row_stop_ids(params, eos_ids))])


class ThinkBudget:
    """Closes the think section when `budget` thinking tokens are spent.
    Counts the tokens sampled inside the section (opened by the prompt or
    by the start marker, which may be several tokens: gpt-oss's
    `<|channel|>analysis<|message|>`); once the count reaches the budget,
    only the end marker may be sampled, so the model goes on to its answer.
    """

    def __init__(self, *, budget: int, start: int | tuple[int, ...], end: int, opened: bool) -> None:
        self._budget, self._end = budget, end
        self._start = (start,) if isinstance(start, int) else start
        self._inside, self._spent, self._started = opened, 0, False
        self._recent: tuple[int, ...] = ()

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._started:
            self._see(cast(int, tokens[-1].item()))
        self._started = True
        if not self._inside or self._spent < self._budget:
            return logits
        only_end = mx.full(logits.shape, -mx.inf, dtype=logits.dtype)
        only_end[..., self._end] = 0.0
        return logits + only_end

    def _see(self, token: int) -> None:
        self._recent = (*self._recent, token)[-len(self._start) :]
        if self._recent == self._start:
            self._inside, self._spent = True, 0
        elif token == self._end:
            self._inside = False
        elif self._inside:
            self._spent += 1


def token_scores(logprobs: mx.array, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """The chosen token's logprob and the `top` most likely (id, logprob) pairs.

    `logprobs` is the row's normalized distribution after its logits
    processors: the one its sampler drew from, in the same step.
    """
    chosen = cast(float, logprobs[token].item())
    if top <= 0:
        return chosen, ()
    ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
    values = logprobs[ids]
    pairs = sorted(zip(cast(list[int], ids.tolist()), cast(list[float], values.tolist())), key=lambda pair: -pair[1])
    # Tokens a grammar or bias ruled out were never candidates (and -inf is not JSON).
    return chosen, tuple(pair for pair in pairs if math.isfinite(pair[1]))


def row_processors(
    row: Prepared, think_ids: tuple[tuple[int, ...], int] | None, eos_ids: Iterable[int] = ()
) -> list[LogitsProcessor]:
    """A row's logits processors: penalties and bias, its thinking budget, `min_tokens`, its grammar (its own copy)."""
    budget = row.params.thinking_budget
    think = None
    if budget is not None and think_ids is not None:
        start, end = think_ids
        think = ThinkBudget(budget=budget, start=start, end=end, opened=_opened(row.prompt_tokens[-64:], start, end))
    # The matcher advances with the row's tokens, so each row gets its own.
    matcher = row.constraint.matcher() if row.constraint is not None else None
    at_least = (
        MinTokens(row.params.min_tokens, sorted(row_stop_ids(row.params, eos_ids))) if row.params.min_tokens else None
    )
    return make_row_processors(row.params.sampling, row.max_tokens, matcher, think, at_least)


def _opened(prompt: tuple[int, ...], start: int | tuple[int, ...], end: int) -> bool:
    """The prompt ends inside a think section its template opened."""
    marker = (start,) if isinstance(start, int) else start
    size = len(marker)
    last_start = max((i for i in range(len(prompt) - size + 1) if prompt[i : i + size] == marker), default=-1)
    return last_start >= 0 and end not in prompt[last_start + size :]
