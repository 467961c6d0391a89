"""stages/model_thread/sampling.py: per-row samplers with their own keys, and logits processors."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from pipeline.requests import Constraint, ConstraintKind, Sampling
from stages.model_thread.sampling import ConstraintProcessor, KeyedSampler, make_row_processors, make_row_sampler
from stages.models.loading import ModelInfo, Tokenizer
from stages.prompt.constraints import ConstraintCompiler

VOCAB = 64
DRAWS = 24


def logprobs(vocab: int = VOCAB) -> mx.array:
    """A fixed, fairly flat distribution over `vocab` tokens whose argmax is token 37 % vocab."""
    peak = 37 % vocab
    logits = [math.sin(i * 0.7) for i in range(vocab)]
    logits[peak] = 2.5
    row = mx.array([logits])
    return row - mx.logsumexp(row, axis=-1, keepdims=True)


def draws(sampler: object, row: mx.array, count: int = DRAWS) -> list[int]:
    assert callable(sampler)
    out = []
    for _ in range(count):
        token = sampler(row)
        assert token.shape == (1,)
        out.append(int(token.item()))
    return out


ARGMAX = int(mx.argmax(logprobs(), axis=-1).item())


@pytest.mark.parametrize(
    "sampling",
    [
        pytest.param(Sampling(seed=7), id="plain"),
        pytest.param(Sampling(seed=7, temperature=0.7, top_p=0.9), id="top_p"),
        pytest.param(Sampling(seed=7, top_k=10, min_p=0.01), id="top_k-min_p"),
    ],
)
def test_the_same_seed_gives_the_same_tokens(sampling: Sampling) -> None:
    """Two rows with the same seed sample the same sequence from the same logits, step after step."""
    row = logprobs()
    first, second = draws(KeyedSampler(sampling), row), draws(KeyedSampler(sampling), row)
    assert first == second
    assert len(set(first)) > 1, "the key must advance every step"
    assert all(0 <= token < VOCAB for token in first)


def test_the_sequence_does_not_depend_on_other_rows() -> None:
    """A seeded row's tokens are the same whether or not other samplers draw in between (own key, no global state)."""
    row = logprobs()
    alone = draws(KeyedSampler(Sampling(seed=11)), row)
    seeded, noisy = KeyedSampler(Sampling(seed=11)), KeyedSampler(Sampling(seed=99))
    interleaved = []
    for _ in range(DRAWS):
        interleaved.append(int(seeded(row).item()))
        noisy(row)
        mx.random.seed(0)
    assert interleaved == alone


def test_different_seeds_give_different_tokens() -> None:
    """The seed is what picks the sequence."""
    row = logprobs()
    assert draws(KeyedSampler(Sampling(seed=1)), row) != draws(KeyedSampler(Sampling(seed=2)), row)


@pytest.mark.parametrize("vocab", [VOCAB, 1024])
def test_temperature_zero_is_argmax(vocab: int) -> None:
    """temperature 0 means greedy: always the most likely token."""
    row = logprobs(vocab)
    expected = int(mx.argmax(row, axis=-1).item())
    assert draws(make_row_sampler(Sampling(temperature=0.0)), row) == [expected] * DRAWS


@pytest.mark.parametrize(
    "sampling",
    [
        pytest.param(Sampling(top_k=1, seed=3), id="top_k-1"),
        pytest.param(Sampling(top_k=1, temperature=2.0, seed=3), id="top_k-1-hot"),
        pytest.param(Sampling(min_p=1.0, seed=3), id="min_p-1"),
        pytest.param(Sampling(top_p=1e-6, seed=3), id="tiny-top_p"),
        # top_p is the probability mass kept: 0 keeps only the most likely token, it does not turn filtering off.
        pytest.param(Sampling(top_p=0.0, seed=3), id="top_p-0"),
    ],
)
def test_filters_that_keep_one_token_are_argmax(sampling: Sampling) -> None:
    """A filter that leaves a single candidate makes sampling deterministic: the argmax, every step."""
    assert draws(make_row_sampler(sampling), logprobs()) == [ARGMAX] * DRAWS


@pytest.mark.parametrize("top_k", [VOCAB, VOCAB + 100], ids=["vocab-size", "beyond-vocab"])
def test_top_k_at_or_above_the_vocabulary_keeps_everything(top_k: int) -> None:
    """A client's top_k larger than the vocabulary filters nothing (and must not raise in the model thread)."""
    row = logprobs()
    expected = draws(KeyedSampler(Sampling(seed=5)), row)
    assert draws(KeyedSampler(Sampling(seed=5, top_k=top_k)), row) == expected


def test_top_k_keeps_only_the_k_most_likely() -> None:
    """With top_k=3 every sampled token is one of the three most likely."""
    row = logprobs()
    top3 = set(mx.argsort(-row, axis=-1)[0, :3].tolist())
    assert set(draws(KeyedSampler(Sampling(seed=8, top_k=3)), row, 64)) <= top3


def test_unseeded_rows_still_sample_valid_tokens() -> None:
    """Without a seed a row gets a random key and samples ids inside the vocabulary."""
    assert all(0 <= token < VOCAB for token in draws(make_row_sampler(Sampling()), logprobs()))


def test_no_processors_without_penalties_or_bias() -> None:
    """Plain sampling adds no logits processors to the row."""
    assert make_row_processors(Sampling(), max_tokens=16) == []


def test_logit_bias_moves_the_argmax() -> None:
    """A +100 bias on a token makes greedy decoding pick it."""
    (bias,) = make_row_processors(Sampling(logit_bias={5: 100.0}), max_tokens=16)
    biased = bias(mx.array([1, 2]), logprobs())
    assert int(mx.argmax(biased, axis=-1).item()) == 5


@pytest.mark.parametrize(
    "sampling",
    [
        pytest.param(Sampling(presence_penalty=2.0), id="presence"),
        pytest.param(Sampling(frequency_penalty=2.0), id="frequency"),
        pytest.param(Sampling(repetition_penalty=10.0), id="repetition"),
    ],
)
def test_penalties_count_tokens_from_the_whole_completion(sampling: Sampling) -> None:
    """A penalty sees every generated token, not only the last 20: the first token is still penalised later."""
    (penalty,) = make_row_processors(sampling, max_tokens=100)
    history = mx.array([ARGMAX] + [1] * 40)
    penalised = penalty(history, logprobs())
    assert float(penalised[0, ARGMAX].item()) < float(logprobs()[0, ARGMAX].item())


def test_a_rewound_sampler_draws_again_what_it_drew() -> None:
    """mlx-lm samples one token past the last it returned; a preempted row resumes from that key."""
    reference = draws(KeyedSampler(Sampling(seed=5)), logprobs(), 9)
    sampler = KeyedSampler(Sampling(seed=5))
    first = draws(sampler, logprobs(), 6)
    sampler.rewind(5)
    # The sixth draw again, from the same key, then on as if nothing happened.
    assert first[:5] + draws(sampler, logprobs(), 4) == reference
    assert first == reference[:6]


def test_a_sampler_rewinds_one_call_at_most() -> None:
    sampler = KeyedSampler(Sampling(seed=5))
    draws(sampler, logprobs(), 3)
    sampler.rewind(3)  # no-op
    with pytest.raises(ValueError, match="rewind"):
        sampler.rewind(1)


def test_a_rewound_grammar_sees_the_resumed_tokens_as_before(tokenizer: Tokenizer, model_info: ModelInfo) -> None:
    """The constraint processor rolls its matcher back to the state before the token it will see again."""
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=model_info.vocab_size)
    constraint = Constraint(kind=ConstraintKind.REGEX, spec="[a-z]+ [a-z]+ [a-z]+!", param="test")
    processor = ConstraintProcessor(compiler.compile(constraint).matcher())
    logits = mx.zeros((1, model_info.vocab_size))
    tokens: list[int] = []
    masks = []
    for _ in range(4):
        masked = processor(mx.array(tokens or [0]), logits)
        masks.append(masked)
        tokens.append(int(mx.argmax(masked, axis=-1).item()))
    # Four calls, three tokens consumed: preempted after returning three tokens, the row resumes at call four.
    processor.rewind(3)
    assert mx.array_equal(processor(mx.array(tokens[:3]), logits), masks[3])
    processor.rewind(0)
    assert mx.array_equal(processor(mx.array([0]), logits), masks[0])


def test_a_grammar_that_read_a_token_ahead_takes_another_in_its_place(
    tokenizer: Tokenizer, model_info: ModelInfo
) -> None:
    """`forced_after` read one token, the call brings another: the matcher gives it up and takes the one brought."""
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=model_info.vocab_size)
    compiled = compiler.compile(Constraint(kind=ConstraintKind.REGEX, spec="[a-z] [a-z]+!", param="test"))
    ahead, plain = ConstraintProcessor(compiled.matcher()), ConstraintProcessor(compiled.matcher())
    logits = mx.zeros((1, model_info.vocab_size))
    first = ahead(mx.array([0]), logits)
    plain(mx.array([0]), logits)
    read, brought = (int(token) for token in mx.argsort(-first[0])[:2].tolist())
    assert read != brought and math.isfinite(first[0, brought].item())
    ahead.forced_after(read, 4)
    assert mx.array_equal(ahead(mx.array([brought]), logits), plain(mx.array([brought]), logits)).item()
    assert ahead.fault is None


def test_typical_p_keeps_the_tokens_nearest_the_entropy_until_the_mass() -> None:
    from stages.model_thread.sampling import apply_typical_p

    # Entropy of (0.5, 0.3, 0.15, 0.05) is 1.14 nats; surprises are 0.69, 1.20, 1.90, 3.00:
    # token 1 is the most typical, then 0, then 2, then 3.
    row = mx.log(mx.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda mass: [i for i, v in enumerate(apply_typical_p(row, mass)[0].tolist()) if math.isfinite(v)]  # noqa: E731
    assert kept(0.1) == [1]
    assert kept(0.3) == [1]
    assert kept(0.31) == [0, 1]
    assert kept(0.85) == [0, 1, 2]
    assert kept(0.99) == [0, 1, 2, 3]
    # What it keeps is unchanged: the sampler still draws by the model's odds.
    assert apply_typical_p(row, 0.5)[0, 0].item() == pytest.approx(math.log(0.5))


def test_typical_p_in_a_keyed_sampler_narrows_the_draws() -> None:
    free = set(draws(KeyedSampler(Sampling(seed=3)), logprobs()))
    typical = set(draws(KeyedSampler(Sampling(seed=3, typical_p=1e-6)), logprobs()))
    assert len(typical) == 1 and len(free) > 1


def test_min_tokens_bans_the_stop_tokens_until_the_count_then_lets_them_through() -> None:
    from stages.model_thread.sampling import MinTokens

    processor = MinTokens(2, [5, 9])
    logits = mx.zeros((1, VOCAB))
    first, second, third = (processor(mx.array([1]), logits)[0] for _ in range(3))
    assert first[5].item() == -math.inf and first[9].item() == -math.inf and first[4].item() == 0
    assert second[9].item() == -math.inf
    assert third[5].item() == 0 and third[9].item() == 0
    # A preempted row resumes with the count it had.
    processor.rewind(1)
    assert processor(mx.array([1]), logits)[0, 5].item() == -math.inf
    # Where only a stop token is left (a grammar at its end), it stays: no row is left with nothing to sample.
    only_stop = mx.where(mx.arange(VOCAB) == 5, 0.0, -math.inf)[None]
    assert MinTokens(3, [5, 9])(mx.array([1]), only_stop)[0, 5].item() == 0


def test_row_stop_ids_are_eos_unless_ignored_plus_the_requested_ones() -> None:
    from pipeline.requests import GenerationParams
    from stages.model_thread.sampling import row_stop_ids

    params = GenerationParams(max_tokens=4, sampling=Sampling(), stop_token_ids=(7,))
    assert row_stop_ids(params, [0, 2]) == {0, 2, 7}
    assert row_stop_ids(
        GenerationParams(max_tokens=4, sampling=Sampling(), ignore_eos=True, stop_token_ids=(7,)), [0, 2]
    ) == {7}


def test_a_matcher_that_fails_mid_generation_keeps_its_reason(tokenizer: Tokenizer, model_info: ModelInfo) -> None:
    """llguidance never raises mid-generation: the processor notices the error state and keeps llguidance's reason.

    The matcher is driven into its error state by consuming a token its mask forbids (the state a limit met
    mid-generation leaves, which no small grammar reaches in a test's time).
    """
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=model_info.vocab_size)
    processor = ConstraintProcessor(
        compiler.compile(Constraint(kind=ConstraintKind.REGEX, spec="ab+", param="p")).matcher()
    )
    logits = mx.zeros((1, model_info.vocab_size))
    first = processor(mx.array([0]), logits)
    assert processor.fault is None
    forbidden = int(mx.argmin(first, axis=-1).item())
    assert first[0, forbidden].item() == -math.inf
    processor(mx.array([0, forbidden]), logits)
    assert processor.fault is not None and processor.fault.strip()


@pytest.mark.parametrize(
    ("sampling", "takes_logits"),
    [
        (Sampling(temperature=0.8, seed=1), True),
        (Sampling(temperature=0.8, seed=1, min_p=0.1, top_k=5), True),
        (Sampling(temperature=0.8, seed=1, top_p=0.9), False),
        (Sampling(temperature=0.8, seed=1, typical_p=0.9), False),
    ],
    ids=["temperature", "min-p-top-k", "top-p", "typical-p"],
)
def test_a_sampler_that_weighs_no_probabilities_draws_the_same_from_logits_as_from_logprobs(
    sampling: Sampling, takes_logits: bool
) -> None:
    """Temperature, min-p, top-k and the categorical draw look only at differences between a row's values, so the
    batch hands such a sampler the logits and skips the normalization (stages/model_thread/greedy_steps.py)."""
    assert KeyedSampler(sampling).takes_logits is takes_logits
    if not takes_logits:
        return
    logits = mx.random.normal((1, 64), key=mx.random.key(7)) * 3 + 40
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    assert draws(KeyedSampler(sampling), logits, 32) == draws(KeyedSampler(sampling), logprobs, 32)
