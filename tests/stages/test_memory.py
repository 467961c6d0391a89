"""stages/memory.py: the memory plan, from a model directory and a machine, as plain arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.memory import BudgetError, Machine, ModelShape, assess, plan, predicted_decode_rate, read_model_shape, transient_bytes

MACHINE = Machine(ram_bytes=16 * 2**30, chip="Apple M2", cpus=8, bandwidth_bytes_per_s=100e9, bandwidth_source="published")


def model_dir(tmp_path: Path, **config: object) -> Path:
    base = {"num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 512,
            "intermediate_size": 1536, "torch_dtype": "bfloat16"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(base | config))
    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 3000)
    (tmp_path / "model-00002.safetensors").write_bytes(b"\0" * 1000)
    return tmp_path


def test_kv_bytes_per_token_from_the_config(tmp_path: Path) -> None:
    """layers x kv heads x head_dim x (keys + values) x dtype bytes; weights from the files."""
    shape = read_model_shape(model_dir(tmp_path), 4096)
    assert shape.kv_bytes_per_token == 8 * 4 * 64 * 2 * 2
    assert shape.weights_bytes == 4000


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param({"head_dim": 128}, 8 * 4 * 128 * 2 * 2, id="explicit-head_dim"),
        pytest.param({"torch_dtype": "float32"}, 8 * 4 * 64 * 2 * 4, id="float32"),
        pytest.param({"num_key_value_heads": None}, 8 * 8 * 64 * 2 * 2, id="no-gqa"),
        pytest.param({"text_config": {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64}},
                     2 * 2 * 32 * 2 * 2, id="nested-text_config"),  # fmt: skip
    ],
)
def test_config_variants(tmp_path: Path, config: dict[str, object], expected: int) -> None:
    assert read_model_shape(model_dir(tmp_path, **config), 4096).kv_bytes_per_token == expected


def shape(**changes: int) -> ModelShape:
    base = {"weights_bytes": 10**9, "layers": 8, "kv_heads": 4, "head_dim": 64, "attention_heads": 8,
            "hidden_size": 512, "intermediate_size": 1536, "dtype_bytes": 2, "context_window": 32768}  # fmt: skip
    return ModelShape(**(base | changes))


def test_the_budget_splits_into_weights_transient_cache_and_kv() -> None:
    memory = plan(shape(), MACHINE, budget=2 * 10**9, prompt_cache=10**8, transient=2 * 10**8)
    assert memory.budget_source == "MLX_RELAY_MEMORY_BUDGET"
    assert memory.prompt_cache_bytes == 10**8
    assert memory.usable_bytes == 2 * 10**9 - 10**9 - 2 * 10**8 - 10**8
    assert memory.max_safe_context == min(32768, memory.usable_bytes // (8 * 4 * 64 * 2 * 2))


def test_without_a_budget_three_quarters_of_ram() -> None:
    memory = plan(shape(), MACHINE, budget=0, prompt_cache=0, transient=0)
    assert memory.budget_bytes == 12 * 2**30 and memory.budget_source == "75% of RAM"
    assert memory.max_safe_context == 32768  # the window, long before memory


def test_the_prompt_cache_takes_at_most_half_of_what_is_left() -> None:
    memory = plan(shape(), MACHINE, budget=2 * 10**9, prompt_cache=10**12, transient=0)
    assert memory.prompt_cache_bytes == 10**9 // 2 and memory.usable_bytes == 10**9 - 10**9 // 2


def test_a_budget_below_the_weights_refuses_to_start() -> None:
    with pytest.raises(BudgetError, match="MLX_RELAY_MEMORY_BUDGET"):
        plan(shape(), MACHINE, budget=10**9, prompt_cache=0, transient=10**6)


def test_transient_grows_with_the_prefill_batch_and_the_window() -> None:
    one = transient_bytes(shape(), prefill_rows=1, prefill_step=512)
    assert transient_bytes(shape(), prefill_rows=4, prefill_step=512) == 4 * one
    assert one == 512 * (8 * 32768 + 3 * 1536 + 4 * 512) * 4


def test_the_decode_bound_reads_weights_and_kv_once_per_token() -> None:
    assert predicted_decode_rate(shape(), MACHINE, 0) == pytest.approx(100.0)
    assert predicted_decode_rate(shape(), MACHINE, 1000) < predicted_decode_rate(shape(), MACHINE, 0)


def test_assess_reads_this_machine(tmp_path: Path) -> None:
    fit = assess(model_dir(tmp_path), context_window=2048, budget=0, prompt_cache=2**20, max_batch=2, prefill_step=64)
    assert fit.machine.ram_bytes > 0 and fit.machine.bandwidth_bytes_per_s > 0
    assert fit.memory.max_safe_context == 2048 and fit.decode_tokens_per_s.empty_context > 0
