"""The memory plan for the models people run, on the Macs they have (published config.json figures).

Each config below is copied from the model's config.json on the Hugging
Face hub (the repo is cited beside it); weights are the 4-bit MLX
conversions' sizes: parameters x 4.5 bits (4-bit values plus a float16
scale and bias per group of 64), or the published MXFP4 size for
gpt-oss. At the default settings (MLX_RELAY_MAX_BATCH=16, prefill step
512, a 1 GiB prompt cache, 75% of RAM) on Metal: a model whose weights fit
starts; one row gets the full context window wherever its full-window KV
fits; and 16 concurrent requests without max_tokens start together
wherever their current KV fits.
"""

from __future__ import annotations

from typing import Any

import pytest

from stages.kv.machine import Machine
from stages.kv.plan import BudgetError, MemoryPlan, plan, transient
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import BLOCK, ModelShape, shape_from_config

GB = 2**30
MACHINES = (8, 16, 32, 64, 128, 192)


def four_bit(parameters: float) -> int:
    return int(parameters * 4.5 / 8)


# name: (config.json figures, weights bytes, expected KV bytes per token once windows are full,
#        expected KV bytes of one row at the full window), the last two computed by hand.
MODELS: dict[str, tuple[dict[str, Any], int, int, int]] = {
    # https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json
    "Qwen3-0.6B": (
        {
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "sliding_window": None,
            "use_sliding_window": False,
            "torch_dtype": "bfloat16",
        },
        four_bit(0.75e9),
        28 * 8 * 128 * 4,
        28 * 8 * 128 * 4 * 40960,
    ),
    # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
    "Qwen3-8B": (
        {
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "sliding_window": None,
            "use_sliding_window": False,
            "torch_dtype": "bfloat16",
        },
        four_bit(8.19e9),
        36 * 8 * 128 * 4,
        36 * 8 * 128 * 4 * 40960,
    ),
    # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
    "Qwen3-30B-A3B": (
        {
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "sliding_window": None,
            "use_sliding_window": False,
            "torch_dtype": "bfloat16",
        },
        four_bit(30.5e9),
        48 * 4 * 128 * 4,
        48 * 4 * 128 * 4 * 40960,
    ),
    # https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
    "Llama-3.1-8B": (
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
        },
        four_bit(8.03e9),
        32 * 8 * 128 * 4,
        32 * 8 * 128 * 4 * 131072,
    ),
    # https://huggingface.co/meta-llama/Llama-3.2-3B-Instruct/blob/main/config.json
    "Llama-3.2-3B": (
        {
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 28,
            "num_attention_heads": 24,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
        },
        four_bit(3.21e9),
        28 * 8 * 128 * 4,
        28 * 8 * 128 * 4 * 131072,
    ),
    # https://huggingface.co/mistralai/Mistral-Small-24B-Instruct-2501/blob/main/config.json
    "Mistral-Small-24B": (
        {
            "hidden_size": 5120,
            "intermediate_size": 32768,
            "num_hidden_layers": 40,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 32768,
            "sliding_window": None,
            "torch_dtype": "bfloat16",
        },
        four_bit(23.6e9),
        40 * 8 * 128 * 4,
        40 * 8 * 128 * 4 * 32768,
    ),
    # https://huggingface.co/google/gemma-3-12b-it/blob/main/config.json: 5 local layers of every 6, window 1024
    "Gemma-3-12B": (
        {
            "text_config": {
                "hidden_size": 3840,
                "intermediate_size": 15360,
                "num_hidden_layers": 48,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 256,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "max_position_embeddings": 131072,
            },
            "torch_dtype": "bfloat16",
        },
        four_bit(12.2e9),
        8 * 8 * 256 * 4,
        8 * 8 * 256 * 4 * 131072 + 40 * 8 * 256 * 4 * 1024,
    ),
    # https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json: alternating sliding 128 / full; MXFP4 ~12.8 GB
    "gpt-oss-20b": (
        {
            "hidden_size": 2880,
            "intermediate_size": 2880,
            "num_local_experts": 32,
            "num_experts_per_tok": 4,
            "num_hidden_layers": 24,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "sliding_window": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 12,
            "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
        },
        int(12.8e9),
        12 * 8 * 64 * 4,
        12 * 8 * 64 * 4 * 131072 + 12 * 8 * 64 * 4 * 128,
    ),
}


def model(name: str) -> ModelShape:
    config, weights, _, _ = MODELS[name]
    text = config.get("text_config") or config
    return shape_from_config(config, weights_bytes=weights, context_window=text["max_position_embeddings"])


def mac(gigabytes: int) -> Machine:
    return Machine(
        ram_bytes=gigabytes * GB,
        chip="Apple M4 Max",
        cpus=16,
        bandwidth_bytes_per_s=546e9,
        bandwidth_source="published",
        backend="metal",
    )


def default_plan(shape: ModelShape, gigabytes: int) -> MemoryPlan:
    return plan(shape, mac(gigabytes), budget=0, prompt_cache=GB, max_batch=16, prefill_step=512)


CELLS = [pytest.param(name, gigabytes, id=f"{name}-{gigabytes}GB") for name in MODELS for gigabytes in MACHINES]


@pytest.mark.parametrize("name", MODELS)
def test_kv_bytes_of_real_shapes(name: str) -> None:
    """GQA heads, head_dim from the config, and sliding windows that count only the window."""
    shape, (_, _, per_token, full_window) = model(name), MODELS[name]
    assert shape.kv_bytes_per_token == per_token
    assert shape.kv_bytes(shape.context_window) == full_window


@pytest.mark.parametrize(("name", "gigabytes"), CELLS)
def test_every_model_whose_weights_fit_starts_with_the_window_its_kv_allows(name: str, gigabytes: int) -> None:
    shape = model(name)
    budget = int(gigabytes * GB * 0.75)
    one_chunk = transient(shape, backend="metal", prefill_rows=1, prefill_step=512, context=BLOCK).bytes
    if shape.weights_bytes > budget:
        with pytest.raises(BudgetError):
            default_plan(shape, gigabytes)
        return
    if shape.weights_bytes + one_chunk + 2 * shape.kv_bytes(BLOCK) > budget:
        pytest.skip("the weights fit, but with no room to serve a row: not a cell the issue asks about")
    memory = default_plan(shape, gigabytes)
    left = budget - shape.weights_bytes - memory.transient_bytes - memory.prompt_cache_bytes
    if shape.kv_bytes(shape.context_window) <= left:
        assert memory.max_safe_context == shape.context_window
    else:
        assert shape.kv_bytes(memory.max_safe_context) <= memory.usable_bytes
        assert memory.max_safe_context < shape.context_window
    assert memory.weights_bytes + memory.transient_bytes + memory.prompt_cache_bytes + memory.usable_bytes == budget


@pytest.mark.parametrize(("name", "gigabytes"), CELLS)
def test_sixteen_requests_without_max_tokens_start_together_where_their_kv_fits(name: str, gigabytes: int) -> None:
    """16 chat requests of 1,000 prompt tokens each: admitted together when 16 such rows (and a block to grow) fit."""
    shape = model(name)
    try:
        memory = default_plan(shape, gigabytes)
    except BudgetError:
        pytest.skip("the model does not start here")
    kv = KvScheduler(shape, memory.usable_bytes)
    started = 0
    while started < 16 and kv.can_admit(1000):
        kv.admit(started, 1000, kv.arrive())
        started += 1
    together = 16 * shape.kv_bytes(1000 + BLOCK)
    assert (started == 16) == (together <= memory.usable_bytes)
    assert kv.victims() == []


@pytest.mark.parametrize(
    ("name", "gigabytes"),
    [
        ("Qwen3-0.6B", 16),
        ("Llama-3.1-8B", 32),
        ("Qwen3-30B-A3B", 32),
        ("Qwen3-8B", 16),
        ("gpt-oss-20b", 32),
        ("Gemma-3-12B", 32),
        ("Mistral-Small-24B", 32),
        ("Llama-3.2-3B", 32),
    ],
)
def test_the_issue_table_now_reads_full_window(name: str, gigabytes: int) -> None:
    """Cells the old plan refused or cut short; each now serves one row at the model's whole window."""
    shape = model(name)
    memory = default_plan(shape, gigabytes)
    assert memory.max_safe_context == shape.context_window
    # Gemma 3's head dim (256) has no fused prefill kernel on Metal: its scores limit the rows prefilled at once.
    assert memory.prefill_rows == (16 if memory.transient.attention == "fused" else 1)


def test_a_sixteen_row_chat_batch_of_a_small_model_on_a_12_gib_budget() -> None:
    """The issue's done-when: Qwen3-0.6B, 12 GiB, 16 streams of a few thousand tokens run together."""
    shape = model("Qwen3-0.6B")
    memory = plan(shape, mac(64), budget=12 * GB, prompt_cache=GB, max_batch=16, prefill_step=512)
    kv = KvScheduler(shape, memory.usable_bytes)
    assert all(kv.can_admit(2000) and kv.admit(uid, 2000, kv.arrive()) is None for uid in range(16))
