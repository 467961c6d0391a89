"""The memory plan with a quantized KV cache, on the published configs of tests/stages/kv/test_kv_real_models.py.

A quantized token of one head is `head_dim x bits / 8` bytes of values
plus a scale and a bias (the model's dtype) per group: for the bfloat16
models here, 8-bit KV with groups of 64 takes 68/128 of the full size,
4-bit 36/128. The plan and the scheduler count blocks at that size, so
the longest row and the rows that run together grow by the inverse.
"""

from __future__ import annotations

import attrs
import pytest

from stages.kv.plan import budget_for, plan
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import BLOCK, FULL, KvScheme, ModelShape
from tests.stages.kv.test_kv_real_models import GB, MODELS, mac, model

Q8, Q4 = KvScheme(bits=8), KvScheme(bits=4)


def quantized(shape: ModelShape, scheme: KvScheme) -> ModelShape:
    return attrs.evolve(shape, kv_scheme=scheme)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("scheme", [Q8, Q4, KvScheme(bits=8, group_size=32)], ids=lambda s: s.describe())
def test_a_quantized_token_costs_its_values_scales_and_biases(name: str, scheme: KvScheme) -> None:
    shape = model(name)
    assert scheme.bits is not None
    # Per head row: the packed values, then a scale and a bias per group, in the model's dtype (2 bytes here).
    row = shape.head_dim * scheme.bits // 8 + 2 * (shape.head_dim // scheme.group_size) * 2
    assert shape.dtype_bytes == 2
    full_layers = shape.layers - shape.sliding_layers
    assert quantized(shape, scheme).kv_bytes_per_token == full_layers * shape.kv_heads * 2 * row
    assert (
        quantized(shape, scheme).kv_bytes(BLOCK) * shape.layer_token_bytes
        == shape.kv_bytes(BLOCK) * quantized(shape, scheme).layer_token_bytes
    )


def test_the_schemes_name_themselves() -> None:
    assert (FULL.describe(), Q8.describe(), KvScheme(bits=4, group_size=128).describe()) == ("full", "q8g64", "q4g128")
    with pytest.raises(ValueError):
        KvScheme(bits=3)
    with pytest.raises(ValueError):
        KvScheme(bits=8, group_size=48)


@pytest.mark.parametrize(
    ("name", "gigabytes"),
    [("Llama-3.1-8B", 16), ("Llama-3.1-8B", 24), ("Qwen3-8B", 8), ("Qwen3-30B-A3B", 24), ("Llama-3.2-3B", 8)],
)
def test_eight_bit_kv_nearly_doubles_the_longest_row_where_kv_limits_it(name: str, gigabytes: int) -> None:
    """On Metal (fused prefill attention: the working set does not grow with the context) at the default settings."""
    shape = model(name)
    full = plan(shape, mac(gigabytes), budget=0, prompt_cache=GB, max_batch=16, prefill_step=512)
    q8 = plan(quantized(shape, Q8), mac(gigabytes), budget=0, prompt_cache=GB, max_batch=16, prefill_step=512)
    assert full.transient.attention == "fused" and full.max_safe_context < shape.context_window
    assert q8.max_safe_context >= min(shape.context_window, 1.8 * full.max_safe_context)
    assert q8.usable_bytes == full.usable_bytes


def rows_admitted(shape: ModelShape, usable: int, tokens: int, most: int = 64) -> int:
    kv = KvScheduler(shape, usable)
    admitted = 0
    while admitted < most and kv.can_admit(tokens):
        kv.admit(admitted, tokens, kv.arrive())
        admitted += 1
    return admitted


def test_sixteen_rows_of_4k_where_full_precision_admits_eight() -> None:
    """Qwen3-0.6B on a budget whose KV room holds 8 full-precision rows of 4k (not 9): 8-bit KV runs 16."""
    shape = model("Qwen3-0.6B")
    row = shape.kv_bytes(4096 + BLOCK)
    budget = budget_for(shape, mac(64), int(8.75 * row), prompt_cache=GB, max_batch=16, prefill_step=512)
    memory = plan(shape, mac(64), budget=budget, prompt_cache=GB, max_batch=16, prefill_step=512)
    assert rows_admitted(shape, memory.usable_bytes, 4096) == 8
    assert rows_admitted(quantized(shape, Q8), memory.usable_bytes, 4096) >= 16
    assert rows_admitted(quantized(shape, Q4), memory.usable_bytes, 4096) >= 30
