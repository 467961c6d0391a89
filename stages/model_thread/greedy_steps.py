"""A decode step whose greedy rows are not normalized over the vocabulary before their argmax.

mlx-lm's `GenerationBatch._step` turns every row's logits into log-probabilities (`logits - logsumexp`) and
evaluates them, then samples from them. A greedy row's token is the argmax of its logits either way: the
normalization only shifts each row by a constant. On the CPU backend it is not free: MLX computes each exponential
one at a time, about 20 ns each on the build machine, so 16 rows of SmolLM2's 49,152-token vocabulary cost 19.5 ms
a step and Gemma 3's 262,144 about five times that, beside a forward pass of 100-200 ms (docs/benchmarks.md, "The
vocabulary's normalization"). `mlx_lm.server` pays it in every step.

`GreedyStepBatch._step` is mlx-lm 0.32.2's, but for two lines: greedy rows take the argmax of their (processed)
logits, rows whose sampler looks only at differences between their values (temperature, min-p, top-k: the
categorical draw is the softmax's) draw from the logits, and the log-probabilities stay lazy, so they are computed
only for a row whose request reads them (`logprobs`, stages/model_thread/batch_rows.py) or whose sampler weighs
probabilities (top-p, typical-p). `SpeculativeBatch` is one, and the single-row path and the
verifying passes choose a greedy row's token the same way (`greedy_tokens`). A row's first token still comes from
mlx-lm's own step where the row starts in the batch (`PromptProcessingBatch.generate`); the two argmaxes differ
only where subtracting the constant rounds the two largest logits to one float, where mlx-lm's takes the lower
token id. Like speculative_batch.py this subclasses mlx-lm's batch and so reads its private fields. Model
thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.sample_utils import greedy_sampler


def normalized(logits: mx.array) -> mx.array:
    """Log-probabilities over the last axis, lazily: evaluated only where read."""
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def greedy_tokens(logits: mx.array) -> mx.array:
    """Each row's greedy token: the argmax of its logits, which is its log-probabilities' too."""
    return mx.argmax(logits, axis=-1)


def sampled_from(logits: mx.array, logprobs: mx.array, sampler: Callable[[mx.array], mx.array]) -> mx.array:
    """`sampler`'s tokens for these rows: a greedy row's argmax, and a sampler that looks only at differences between a
    row's values (`takes_logits`, stages/model_thread/sampling.py) drawing from the logits; others from `logprobs`."""
    if sampler is greedy_sampler:
        return greedy_tokens(logits)
    return sampler(logits if getattr(sampler, "takes_logits", False) else logprobs)


def sample_rows(logits: mx.array, samplers: Sequence[Callable[[mx.array], mx.array]]) -> tuple[mx.array, mx.array]:
    """A step's tokens for `logits` (one row each) and the rows' log-probabilities, lazy where nothing sampled
    from them. Rows with samplers of their own are normalized one by one: a slice of the batch's lazy
    log-probabilities would compute every row's for one top-p row."""
    logprobs = normalized(logits)
    if all(sampler is samplers[0] for sampler in samplers):
        return sampled_from(logits, logprobs, samplers[0]), logprobs
    rows = [logits[e : e + 1] for e in range(len(samplers))]
    sampled = [sampled_from(row, normalized(row), sampler) for row, sampler in zip(rows, samplers, strict=True)]
    return mx.concatenate(sampled, axis=0), logprobs


class GreedyStepBatch(GenerationBatch):
    def _step(self) -> tuple[list[int], list[mx.array]]:
        # mlx-lm's fields are typed loosely (None until a step has run).
        batch: Any = self
        batch._current_tokens = batch._next_tokens
        batch._current_logprobs = batch._next_logprobs
        inputs = batch._current_tokens
        logits = batch.model(inputs[:, None], cache=batch.prompt_cache)[:, -1, :]
        token_context = []
        if any(batch.logits_processors):
            processed_logits = []
            for e in range(len(batch.uids)):
                sample_logits = logits[e : e + 1]
                # Only sequences with processors need a context.
                processors = batch.logits_processors[e] or ()
                if processors:
                    context = batch._token_context[e].update_and_fetch(inputs[e : e + 1])
                    token_context.append(context)
                    for processor in processors:
                        sample_logits = processor(context, sample_logits)
                processed_logits.append(sample_logits)
            logits = mx.concatenate(processed_logits, axis=0)
        samplers = [batch.fallback_sampler if s is None else s for s in (batch.samplers or [None] * len(batch.uids))]
        sampled, logprobs = sample_rows(logits, samplers)
        batch._next_tokens = sampled
        batch._next_logprobs = list(logprobs)
        # The next step computes while this one is read; its log-probabilities only where a sampler needed them.
        start: Callable[..., None] = mx.async_eval  # untyped in mlx's stubs
        start(sampled, token_context)
        mx.eval(inputs)
        tokens: list[int] = inputs.tolist()
        for row_tokens, token in zip(batch.tokens, tokens, strict=True):
            row_tokens.append(token)
        return tokens, batch._current_logprobs
