"""The fit arithmetic of `mlx-relay pull` and `models --fit` (stages/models/sku.py) against published configs.

The configs are the published config.json files' figures; the weights are their bf16 safetensors' total size.
Stream counts are checked against bounds worked by hand: a machine plans for 75% of its memory, less the
weights; the prompt cache (at most 1 GiB) and a prefill chunk (under 2 GB here) come out of the rest.
"""

from __future__ import annotations

import pytest

from stages.models.sku import APPLE_MEMORY_GB, Planning, apple_machine, model_shape, sku_matrix, verdict

LLAMA_31_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
LLAMA_31_70B = {
    **LLAMA_31_8B,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "hidden_size": 8192,
    "intermediate_size": 28672,
}
QWEN3_06B = {
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}
WEIGHTS = {"8b": 16_060_522_496, "70b": 141_107_412_992, "0.6b": 1_503_300_328}


@pytest.mark.parametrize(
    ("config", "per_token"),
    [
        # layers x kv heads x head_dim x (keys + values) x 2 bytes
        pytest.param(LLAMA_31_8B, 32 * 8 * 128 * 2 * 2, id="llama-3.1-8b"),
        pytest.param(LLAMA_31_70B, 80 * 8 * 128 * 2 * 2, id="llama-3.1-70b"),
        pytest.param(QWEN3_06B, 28 * 8 * 128 * 2 * 2, id="qwen3-0.6b"),
    ],
)
def test_kv_bytes_per_token(config: dict[str, object], per_token: int) -> None:
    assert model_shape(config, 0).kv_bytes_per_token == per_token


def _by_memory(config: dict[str, object], weights: int) -> dict[int, tuple[bool, str | None, int]]:
    matrix = sku_matrix(model_shape(config, weights), Planning())
    return {gb: (cell.fits, cell.kv_scheme, cell.streams) for gb, cell in zip(APPLE_MEMORY_GB, matrix, strict=True)}


def test_llama_8b_by_apple_memory() -> None:
    cells = _by_memory(LLAMA_31_8B, WEIGHTS["8b"])
    # 16 GB plans 12 GB: less than its 16.06 GB of weights.
    assert cells[8][0] is False and cells[16][0] is False
    # 192 GB: 144 - 16.06 = 127.9 GB, at most 2 GB of it cache and chunk; a full row is 131072 x 128 KiB = 17.18 GB:
    # 125.9 / 17.18 = 7.3 and 127.9 / 17.18 = 7.4, so 7 streams at full precision.
    assert cells[192] == (True, "full", 7)
    # 512 GB: (384 - 16.06 - 2) / 17.18 = 21.3 to 367.9 / 17.18 = 21.4.
    assert cells[512] == (True, "full", 21)


def test_llama_70b_needs_256_gb_for_a_full_window() -> None:
    cells = _by_memory(LLAMA_31_70B, WEIGHTS["70b"])
    assert not any(cells[gb][0] for gb in (8, 16, 24, 32, 36, 48, 64, 96, 128))
    # 192 GB: 2.9 GB beside the weights, under a 4-bit row of the window (131072 x 90 KiB = 12.1 GB): fits, but no
    # stream of the whole window.
    assert cells[192] == (True, "q4g64", 0)
    # 256 GB: 192 - 141.1 = 50.9 GB, a full row 131072 x 320 KiB = 42.9 GB: one stream at full precision.
    assert cells[256] == (True, "full", 1)
    assert cells[512] == (True, "full", 5)


def test_qwen3_small_machine_falls_back_to_8_bit_kv() -> None:
    cells = _by_memory(QWEN3_06B, WEIGHTS["0.6b"])
    # 8 GB: 6 - 1.5 = 4.5 GB, less cache and chunk (1.4 GB) = 3.1; a full row is 40960 x 112 KiB = 4.7 GB at full,
    # 2.5 GB at 8 bits (136 bytes a head's row): one stream at q8g64.
    assert cells[8] == (True, "q8g64", 1)
    assert cells[16][1] == "full" and cells[16][2] >= 1


def test_a_budget_plans_this_machine() -> None:
    shape = model_shape(LLAMA_31_8B, WEIGHTS["8b"])
    assert not verdict(shape, apple_machine(512), Planning(budget=10**10)).fits
    assert verdict(shape, apple_machine(8), Planning(budget=200 * 10**9)).streams >= 10
