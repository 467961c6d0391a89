"""stages/kv/: the memory plan and the KV account, from a model's config and a machine, as plain arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from stages.kv.machine import Machine
from stages.kv.plan import BudgetError, assess, plan, predicted_decode_rate, transient
from stages.kv.scheduler import KvScheduler
from stages.kv.shape import BLOCK, ModelShape, read_model_shape

MACHINE = Machine(
    ram_bytes=16 * 2**30,
    chip="Apple M2",
    cpus=8,
    bandwidth_bytes_per_s=100e9,
    bandwidth_source="published",
    backend="metal",
)


def model_dir(tmp_path: Path, **config: object) -> Path:
    base = {
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "torch_dtype": "bfloat16",
    }
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
        pytest.param(
            {"text_config": {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64}},
            2 * 2 * 32 * 2 * 2,
            id="nested-text_config",
        ),
        # A window mlx-lm does not build a rotating cache for counts in full.
        pytest.param({"sliding_window": 4096}, 8 * 4 * 64 * 2 * 2, id="mistral-style-window"),
        pytest.param({"sliding_window": 4096, "use_sliding_window": False}, 8 * 4 * 64 * 2 * 2, id="window-off"),
        pytest.param(
            {"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 4},
            4 * 4 * 64 * 2 * 2,
            id="layer_types",
        ),
        pytest.param({"sliding_window": 512, "sliding_window_pattern": 4}, 2 * 4 * 64 * 2 * 2, id="gemma-pattern"),
        # Qwen3-Next / Qwen3.5: only every 4th layer attends; the linear-attention layers hold a fixed state.
        pytest.param({"full_attention_interval": 4}, 2 * 4 * 64 * 2 * 2, id="hybrid-interval"),
        pytest.param(
            {"layer_types": ["linear_attention"] * 3 + ["full_attention"]} | {"num_hidden_layers": 4},
            1 * 4 * 64 * 2 * 2,
            id="hybrid-layer_types",
        ),
    ],
)
def test_config_variants(tmp_path: Path, config: dict[str, object], expected: int) -> None:
    assert read_model_shape(model_dir(tmp_path, **config), 4096).kv_bytes_per_token == expected


def shape(**changes: int) -> ModelShape:
    base = {
        "weights_bytes": 10**9,
        "layers": 8,
        "kv_heads": 4,
        "head_dim": 64,
        "attention_heads": 8,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "dtype_bytes": 2,
        "context_window": 32768,
    }
    return ModelShape(**(base | changes))  # type: ignore[arg-type]


def test_a_row_holds_whole_cache_blocks_and_a_window_holds_at_most_the_window() -> None:
    per_layer = 4 * 64 * 2 * 2
    plain = shape()
    assert plain.kv_bytes(1) == plain.kv_bytes(BLOCK) == 8 * per_layer * BLOCK
    assert plain.kv_bytes(BLOCK + 1) == 8 * per_layer * 2 * BLOCK
    windowed = shape(sliding_layers=6, sliding_window=128)
    assert windowed.kv_bytes(10_000) == 2 * per_layer * 10_240 + 6 * per_layer * 128


def test_the_budget_splits_into_weights_transient_cache_and_kv() -> None:
    memory = plan(shape(), MACHINE, budget=2 * 10**9, prompt_cache=10**8, max_batch=4, prefill_step=512)
    assert memory.budget_source == "MLX_RELAY_MEMORY_BUDGET"
    assert memory.prompt_cache_bytes == 10**8
    assert memory.transient.attention == "fused" and memory.transient.context == 0
    assert memory.usable_bytes == 2 * 10**9 - 10**9 - memory.transient_bytes - 10**8
    assert memory.max_safe_context == min(32768, memory.usable_bytes // (8 * 4 * 64 * 2 * 2) // BLOCK * BLOCK)


def test_without_a_budget_three_quarters_of_ram() -> None:
    memory = plan(shape(), MACHINE, budget=0, prompt_cache=0, max_batch=16, prefill_step=512)
    assert memory.budget_bytes == 12 * 2**30 and memory.budget_source == "75% of RAM"
    assert memory.max_safe_context == 32768  # the window, long before memory


def test_the_prompt_cache_takes_at_most_half_of_what_is_left() -> None:
    memory = plan(shape(), MACHINE, budget=2 * 10**9, prompt_cache=10**12, max_batch=1, prefill_step=512)
    assert memory.prompt_cache_bytes == (10**9 - memory.transient_bytes) // 2


def test_a_budget_below_the_weights_refuses_to_start() -> None:
    with pytest.raises(BudgetError, match="MLX_RELAY_MEMORY_BUDGET"):
        plan(shape(), MACHINE, budget=10**9, prompt_cache=0, max_batch=1, prefill_step=512)


def test_the_prefill_working_set_follows_the_backend() -> None:
    """Fused attention holds no scores; the CPU's holds heads x chunk x context, twice (scores, softmax)."""
    activations = (4 * 512 + 3 * 1536) * 2
    fused = transient(shape(), backend="metal", prefill_rows=4, prefill_step=512, context=32768)
    assert fused.bytes == 4 * 512 * activations
    cpu = transient(shape(), backend="cpu", prefill_rows=4, prefill_step=512, context=32768)
    assert cpu.attention == "unfused" and cpu.bytes == 4 * 512 * (activations + 8 * 32768 * 2 * 2)
    # Metal's fused prefill kernel takes head dims 64, 80 and 128 only.
    assert (
        transient(shape(head_dim=256), backend="metal", prefill_rows=1, prefill_step=512, context=1024).attention
        == "unfused"
    )


def test_on_the_cpu_the_longest_context_pays_for_its_scores() -> None:
    cpu = attrs.evolve(MACHINE, backend="cpu")
    budget = 16 * 10**8
    memory = plan(shape(), cpu, budget=budget, prompt_cache=0, max_batch=16, prefill_step=512)
    assert memory.prefill_rows == 1
    assert memory.transient.context == memory.max_safe_context < 32768
    assert memory.weights_bytes + memory.transient_bytes + shape().kv_bytes(memory.max_safe_context) <= budget
    longer = transient(
        shape(), backend="cpu", prefill_rows=1, prefill_step=512, context=memory.max_safe_context + BLOCK
    )
    assert memory.weights_bytes + longer.bytes + shape().kv_bytes(memory.max_safe_context + BLOCK) > budget


def test_the_decode_bound_reads_weights_and_kv_once_per_token() -> None:
    assert predicted_decode_rate(shape(), MACHINE, 0) == pytest.approx(100.0)
    assert predicted_decode_rate(shape(), MACHINE, 1000) < predicted_decode_rate(shape(), MACHINE, 0)


def test_assess_reads_this_machine(tmp_path: Path) -> None:
    fit = assess(model_dir(tmp_path), context_window=2048, budget=0, prompt_cache=2**20, max_batch=2, prefill_step=64)
    assert fit.machine.ram_bytes > 0 and fit.machine.bandwidth_bytes_per_s > 0
    assert fit.machine.backend in {"cpu", "metal", "cuda"}
    assert fit.memory.max_safe_context == 2048 and fit.decode_tokens_per_s.empty_context > 0


def test_the_account_pads_rows_to_the_longest() -> None:
    """n rows hold n x the longest row, as BatchKVCache pads them, in whole blocks."""
    kv = KvScheduler(shape(), budget_bytes=10 * shape().kv_bytes(BLOCK))
    kv.admit(1, 10, kv.arrive())
    kv.admit(2, 300, kv.arrive())
    assert kv.held_bytes == 2 * shape().kv_bytes(512)
    kv.release(2)
    kv.release(2)
    assert kv.held_bytes == shape().kv_bytes(BLOCK)


def test_admission_wants_a_block_of_growth_and_pressure_preempts_the_latest_arrival() -> None:
    block = shape().kv_bytes(BLOCK)
    kv = KvScheduler(shape(), budget_bytes=6 * block)
    assert kv.can_admit(BLOCK)  # 2 blocks
    kv.admit(1, BLOCK, kv.arrive())
    assert kv.can_admit(BLOCK)  # 2 x 2 blocks
    kv.admit(2, BLOCK, kv.arrive())
    assert kv.can_admit(1)  # 3 rows, each with room to 512 tokens: 6 blocks
    assert not kv.can_admit(BLOCK + 1)  # it pads every row to 3 blocks
    assert kv.victims() == []  # the next token of each fits: 2 x 2 blocks
    kv.advance(1, BLOCK)
    kv.advance(2, BLOCK)
    # 2 rows at 512 need 3 blocks each for the next token: 6 blocks, still fits.
    assert kv.victims() == []
    kv.admit(3, 10, 0)  # an earlier arrival, resumed: not the victim
    assert kv.victims() == [2]
