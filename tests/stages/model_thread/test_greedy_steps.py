"""stages/model_thread/greedy_steps.py: greedy rows take their logits' argmax without normalizing them first, and
every row still gets mlx-lm's tokens, and its log-probabilities where they are read.

Each case runs the same rows through mlx-lm's `BatchGenerator` and through one whose generation batch is a
`GreedyStepBatch` (as the gateway builds it without speculation): tokens, finish reasons, every token's
log-probabilities (read from the responses, as a request asking for `logprobs` reads them) and final caches agree,
for greedy rows alone, greedy rows with logits processors, sampled rows, and all of them sharing one batch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import greedy_sampler

from pipeline.requests import Sampling
from stages.model_thread.drafters import CostGate, PromptLookup, RowPolicy
from stages.model_thread.greedy_steps import GreedyStepBatch, sample_rows
from stages.model_thread.sampling import KeyedSampler
from stages.model_thread.speculative_batch import Speculation, SpeculativeBatch, speculating
from stages.models.loading import ModelInfo, load_weights
from tests.stages.model_thread.drive import (
    COPY,
    GREEDY,
    OTHER,
    PENALISED,
    SEEDED,
    drive,
    real_text_rows,
    same_replies,
)

# Greedy, with a repetition penalty and a logit bias: logits processors run before the argmax.
GREEDY_PENALISED = Sampling(temperature=0.0, repetition_penalty=1.3, logit_bias={5: 3.0, 7: -100.0})
# Sampled with filters that look only at differences between a row's values: drawn from the logits.
MIN_P_TOP_K = Sampling(temperature=0.7, seed=3, min_p=0.05, top_k=20)
# Top-p weighs probabilities: drawn from the log-probabilities.
TOP_P = Sampling(temperature=0.9, seed=4, top_p=0.9)


@pytest.fixture(scope="module")
def model(model_info: ModelInfo) -> Any:
    return load_weights(model_info)


def _batch(model: Any) -> BatchGenerator:
    return BatchGenerator(model, stop_tokens=[[0]], completion_batch_size=4, prefill_batch_size=4)


def _greedy_steps(model: Any) -> Any:
    generator = speculating(lambda: _batch(model), None)()
    assert type(generator._generation_batch) is GreedyStepBatch
    return generator


def _joining(*samplings: Sampling) -> dict[int, list[Any]]:
    """Rows that join while others decode, the i-th with the i-th sampling (cycled)."""
    rows = [("a", COPY, 40), ("b", OTHER, 30), ("c", COPY[5:], 25), ("d", OTHER[:20] + OTHER[:20], 20)]
    calls = [0, 3, 4, 9]
    return {
        call: [(name, prompt, samplings[i % len(samplings)], tokens, [[0]])]
        for i, (call, (name, prompt, tokens)) in enumerate(zip(calls, rows, strict=True))
    }


@pytest.mark.parametrize(
    "samplings",
    [
        (GREEDY,),
        (GREEDY_PENALISED,),
        (SEEDED,),
        (MIN_P_TOP_K,),
        (TOP_P,),
        (GREEDY, SEEDED, GREEDY_PENALISED, PENALISED),
        (TOP_P, MIN_P_TOP_K, GREEDY, SEEDED),
    ],
    ids=["greedy", "greedy-processors", "seeded", "min-p-top-k", "top-p", "all-in-one-batch", "filters-in-one-batch"],
)
def test_every_row_gets_mlx_lms_tokens_and_logprobs(model: Any, samplings: tuple[Sampling, ...]) -> None:
    arrivals = _joining(*samplings)
    expected = drive(_batch(model), arrivals)
    got = drive(_greedy_steps(model), arrivals)
    same_replies(expected, got)
    for name, want in expected.items():
        for mine, theirs in zip(got[name]["cache"], want["cache"], strict=True):
            assert mine.offset == theirs.offset, name
            assert mx.allclose(mine.state[0], theirs.state[0], atol=1e-4).item(), name


def test_a_step_samples_greedy_rows_from_their_logits_and_the_rest_from_their_logprobs() -> None:
    logits = mx.array([[0.5, 3.0, -1.0, 2.9], [1.0, 0.0, 4.0, 4.5], [0.1, 0.2, 0.3, 0.0]])
    seen: list[mx.array] = []

    def last(logprobs: mx.array) -> mx.array:
        seen.append(logprobs)
        return mx.array([3], dtype=mx.uint32)

    tokens, logprobs = sample_rows(logits, [greedy_sampler, greedy_sampler, greedy_sampler])
    assert tokens.tolist() == [1, 3, 2]
    assert mx.allclose(logprobs, logits - mx.logsumexp(logits, axis=-1, keepdims=True)).item()
    tokens, _ = sample_rows(logits, [greedy_sampler, last, greedy_sampler])
    assert tokens.tolist() == [1, 3, 2]
    # A sampler that does not say it takes logits is handed its normalized row, as mlx-lm hands it ...
    assert mx.allclose(mx.logsumexp(seen[0], axis=-1), mx.array([0.0]), atol=1e-6).item()
    # ... and one that does (a KeyedSampler without top-p or typical-p), the row's logits as they are.
    last.takes_logits = True  # type: ignore[attr-defined]
    sample_rows(logits, [greedy_sampler, last, greedy_sampler])
    assert mx.array_equal(seen[1], logits[1:2]).item()


def test_typical_p_still_weighs_the_row_s_probabilities() -> None:
    """One token at 0.4 and sixty at 0.01: the row's entropy (3.13 nats) is nearer the small tokens' surprise (4.61)
    than the large one's (0.92), so typical-p 0.3 keeps only small tokens. The entropy is the probabilities', which
    the raw logits (each 40 above its log-probability) are not."""
    row = [math.log(0.4), *[math.log(0.01)] * 60, *[-1000.0] * 3]
    logits = mx.array([row]) + 40.0
    sampler = KeyedSampler(Sampling(temperature=1.0, seed=2, typical_p=0.3))
    drawn = {sample_rows(logits, [sampler])[0].item() for _ in range(32)}
    assert 0 not in drawn and len(drawn) > 1


def test_the_gateway_s_batches_take_greedy_steps_with_or_without_speculation(model: Any) -> None:
    policy = RowPolicy(max_k=4, min_acceptance=0.0, max_rows=8)
    speculation = Speculation(drafter=PromptLookup(), policy=policy, gate=CostGate(measured=False))
    generator = speculating(lambda: _batch(model), speculation)()
    assert isinstance(generator._generation_batch, SpeculativeBatch)
    assert isinstance(generator._generation_batch, GreedyStepBatch)
    assert type(_greedy_steps(model)._generation_batch) is GreedyStepBatch


def test_the_real_default_model_gives_mlx_lms_greedy_replies(smollm2_model: Path) -> None:
    """SmolLM2 as the server serves it (float32 on a CPU, its 49,152-token vocabulary): rows of real text, some
    asking for nothing but the argmax, give mlx-lm's replies and log-probabilities."""
    real, arrivals = real_text_rows(smollm2_model, [GREEDY, GREEDY, SEEDED])
    same_replies(drive(_batch(real), arrivals), drive(_greedy_steps(real), arrivals))
