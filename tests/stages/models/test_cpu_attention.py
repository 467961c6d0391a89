"""stages/models/cpu_attention.py: a prefill's attention in numpy gives MLX's answer, for every mask mlx-lm makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base
from mlx_lm.models.base import create_causal_mask

from stages.models import cpu_attention
from tests.stages.models.attention_shapes import shapes

pytestmark = pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the CPU backend's attention")

cpu_attention.install()
mlx_attention = cpu_attention._mlx_attention
SMALLEST_TAKEN = cpu_attention._MIN_SCORES


@pytest.fixture(autouse=True)
def every_size_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    # The small shapes below would go to MLX's own function under the size gate; here they test numpy's answer.
    monkeypatch.setattr(cpu_attention, "_MIN_SCORES", 0)


def assert_same(queries: mx.array, keys: mx.array, values: mx.array, mask: object) -> None:
    assert mlx_attention is not None
    theirs = mlx_attention(queries, keys, values, scale=0.125, mask=mask)
    ours = cpu_attention.attention(queries, keys, values, scale=0.125, mask=mask)
    assert ours.shape == theirs.shape
    assert not np.isnan(np.asarray(ours)).any()
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 9, 3, 512, 1600, 64),
        (2, 4, 1, 40, 100, 256),
        (1, 8, 8, 17, 17, 32),
        (3, 6, 2, 64, 700, 64),
        (1, 9, 3, 9, 1209, 64),
        (2, 9, 3, 3, 1300, 64),
    ],
    ids=["smollm2-chunk", "gemma3-batch", "no-grouping-square", "three-rows", "smollm2-verify", "verify-batch"],
)
def test_every_mask_mlx_lm_makes_gives_mlx_s_answer(shape: tuple[int, ...]) -> None:
    batch, _, _, rows, context, _ = shape
    queries, keys, values = shapes(*shape)
    assert_same(queries, keys, values, "causal")
    assert_same(queries, keys, values, None)
    sliding = create_causal_mask(rows, offset=context - rows, window_size=37)
    assert_same(queries, keys, values, sliding)
    padded = create_causal_mask(rows, offset=context - rows, left_padding=mx.array([3] * batch))
    assert_same(queries, keys, values, padded)
    assert_same(queries, keys, values, mx.where(padded, 0.0, -1e9).astype(mx.float32))


def test_a_per_head_mask_reaches_each_head() -> None:
    queries, keys, values = shapes(2, 6, 2, 32, 90, 64)
    per_head = (mx.random.uniform(shape=(2, 6, 32, 90)) > 0.4) | (mx.arange(90) == 0)
    assert_same(queries, keys, values, per_head)


def test_rows_whose_every_key_is_hidden_do_not_poison_the_others() -> None:
    # A left-padded row's first positions see nothing: their output feeds the next layer's values, where a NaN
    # would reach every real row through a zero weight.
    queries, keys, values = shapes(2, 4, 2, 24, 24, 32)
    padded = create_causal_mask(24, left_padding=mx.array([0, 10]))
    ours = np.asarray(cpu_attention.attention(queries, keys, values, scale=0.125, mask=padded))
    assert np.isfinite(ours).all()
    assert_same(queries, keys, values, padded)


def test_blocks_split_rows_and_still_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    # A block of at most 1,000 scores: many row blocks per head, each causal block over its own keys.
    monkeypatch.setattr(cpu_attention, "_BLOCK_SCORES", 1000)
    queries, keys, values = shapes(1, 9, 3, 64, 200, 64)
    assert_same(queries, keys, values, "causal")
    assert_same(queries, keys, values, create_causal_mask(64, offset=136, window_size=50))


def test_what_numpy_would_not_compute_the_same_goes_to_mlx(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []

    def counting(queries: mx.array, *args: object, **options: object) -> mx.array:
        calls.append(queries.shape)
        assert mlx_attention is not None
        return mlx_attention(queries, *args, **options)

    monkeypatch.setattr(cpu_attention, "_mlx_attention", counting)
    monkeypatch.setattr(cpu_attention, "_MIN_SCORES", SMALLEST_TAKEN)
    # A decode step over fewer keys than the lazy path pays for.
    decode = shapes(1, 4, 2, 1, 600, 32)
    cpu_attention.attention(*decode, scale=0.1, mask=None)
    half = [array.astype(mx.float16) for array in shapes(1, 4, 2, 32, 600, 32)]
    cpu_attention.attention(*half, scale=0.1, mask="causal")
    prefill = shapes(1, 4, 2, 32, 600, 32)
    cpu_attention.attention(*prefill, scale=0.1, mask="causal", sinks=mx.zeros((4,)))
    assert calls == [(1, 4, 1, 32), (1, 4, 32, 32), (1, 4, 32, 32)]
    # A small chunk, and sixteen short prompts prefilled together (many scores in all, but each sequence's block
    # too small to dispatch to numpy), stay lazy: stages/models/cpu_exp.py's softmax, not MLX's.
    small_chunk = shapes(1, 4, 2, 32, 64, 32)
    cpu_attention.attention(*small_chunk, scale=0.1, mask="causal")
    short_prompts = shapes(16, 4, 2, 32, 64, 32)
    cpu_attention.attention(*short_prompts, scale=0.1, mask="causal")
    assert len(calls) == 3
    cpu_attention.attention(*prefill, scale=0.1, mask="causal")
    # A verifying pass: SmolLM2's pending token and 8 proposed after 1,200 tokens, 98k scores.
    verify = shapes(1, 9, 3, 9, 1_209, 64)
    cpu_attention.attention(*verify, scale=0.1, mask="causal")
    assert len(calls) == 3


def test_a_block_holds_at_most_its_share_of_scores_whatever_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    # MLX's fallback holds every score of the chunk at once: for a 70B shape (64 query heads, 512 rows) at a
    # 128k window that is 16 GiB. Here a block's scores stay under _BLOCK_SCORES at any context.
    held: list[int] = []
    attend_block = cpu_attention._attend_block

    def measured(queries: np.ndarray, keys: np.ndarray, *args: object) -> np.ndarray:
        held.append(queries.shape[0] * queries.shape[1] * keys.shape[0])
        return attend_block(queries, keys, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_attention, "_attend_block", measured)
    monkeypatch.setattr(cpu_attention, "_BLOCK_SCORES", 1 << 18)
    queries, keys, values = shapes(1, 16, 2, 64, 20_000, 16)
    cpu_attention.attention(queries, keys, values, scale=0.25, mask=None)
    assert len(held) > 2 and max(held) <= 1 << 18


def test_the_real_default_model_reads_a_prompt_the_same_either_way(smollm2_model: Path) -> None:
    # SmolLM2 as the server serves it (float32 on a CPU), a 300-token prompt in chunks of 128 over its cache: the
    # last position's logits agree, so do 16 greedy tokens after it, and so does a verifying pass's every position
    # (the last token and 8 proposed, here the first 8 again).
    from mlx_lm.models.cache import make_prompt_cache

    from stages.models.loading import load_weights, resolve_model

    model: Any = load_weights(attrs.evolve(resolve_model(str(smollm2_model)), float32_weights=True))
    prompt = mx.array([1, *range(200, 499)])

    def read(attention: object) -> tuple[np.ndarray, list[int], np.ndarray]:
        mx.fast.scaled_dot_product_attention = attention
        try:
            cache = make_prompt_cache(model)
            for start in range(0, prompt.size, 128):
                logits = model(prompt[None, start : start + 128], cache=cache)[:, -1]
            first = np.asarray(logits[0])
            tokens = [int(logits.argmax())]
            for _ in range(15):
                tokens.append(int(model(mx.array([[tokens[-1]]]), cache=cache)[0, -1].argmax()))
            verifying = model(mx.array([[tokens[-1], *tokens[:8]]]), cache=cache)[0]
            return first, tokens, np.asarray(verifying)
        finally:
            mx.fast.scaled_dot_product_attention = cpu_attention.attention

    ours, theirs = read(cpu_attention.attention), read(mlx_attention)
    np.testing.assert_allclose(ours[0], theirs[0], atol=1e-3, rtol=1e-3)
    assert ours[1] == theirs[1]
    assert ours[2].shape == (9, theirs[0].size)
    np.testing.assert_allclose(ours[2], theirs[2], atol=1e-3, rtol=1e-3)


def test_a_choice_other_than_numpy_or_mlx_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_attention.CHOICE_VARIABLE, "off")
    with pytest.raises(ValueError, match="MLX_RELAY_CPU_ATTENTION='off' is not one of numpy, mlx"):
        cpu_attention.install()


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantized_cache_s_prefill_gives_mlx_lm_s_answer(bits: int) -> None:
    # MLX_RELAY_KV_BITS: mlx-lm's own quantized attention is the reference, for each mask it takes.
    assert cpu_attention._mlx_quantized_attention is not None
    queries, keys, values = shapes(1, 9, 3, 64, 400, 64)
    quantized_keys = tuple(mx.quantize(keys, group_size=64, bits=bits))
    quantized_values = tuple(mx.quantize(values, group_size=64, bits=bits))
    padded = create_causal_mask(64, offset=336, left_padding=mx.array([5]))
    for mask in ("causal", None, padded):
        # mlx-lm's function scales its queries in place (`queries *= scale`): it gets a copy.
        theirs = cpu_attention._mlx_quantized_attention(
            queries * 1, quantized_keys, quantized_values, 0.125, mask, 64, bits
        )
        ours = cpu_attention.quantized_attention(queries, quantized_keys, quantized_values, 0.125, mask, 64, bits)
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=5e-5, rtol=1e-4)


def test_mlx_lm_s_models_reach_the_quantized_path_through_their_cache() -> None:
    # The models call mlx-lm's `scaled_dot_product_attention`, which looks the quantized function up in its module
    # at call time: a cache with `bits` must land here.
    class QuantizedCache:
        bits, group_size = 8, 64

    queries, keys, values = shapes(1, 4, 2, 32, 600, 32)
    quantized = [tuple(mx.quantize(array, group_size=32, bits=8)) for array in (keys, values)]
    seen: list[int] = []
    original = cpu_attention._attend

    def counted(*args: object) -> np.ndarray:
        seen.append(1)
        return original(*args)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_attention, "_attend", counted)
        QuantizedCache.group_size = 32
        base.scaled_dot_product_attention(queries, *quantized, QuantizedCache(), 0.1, "causal")
    assert seen == [1]
