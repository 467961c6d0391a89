"""Residency decisions with published models' sizes on 16, 64 and 192 GB machines (fleet/policy.py).

Footprints come from each model's published config.json and weight size
(mlx-community's 4-bit conversions, the bf16 release) through the memory
plan, with 8192 tokens of KV each, so the table tests the plan and the
policy together; the machines are Apple silicon of those sizes.
"""

from __future__ import annotations

import pytest

from fleet.footprint import fleet_budget, footprint
from fleet.policy import Place, Refuse, Resident, expired, place
from fleet.spec import KvSpec, ModelSpec
from pipeline.settings import Settings
from stages.kv.machine import Machine
from stages.kv.shape import shape_from_config

GB = 10**9
_LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
_QWEN3_30B_A3B = {
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts_per_tok": 8,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
_LLAMA_70B = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
# (config, weight bytes as published, context window)
MODELS = {
    "llama-8b-4bit": (_LLAMA_8B, 4.52 * GB, 131072),
    "llama-8b-bf16": (_LLAMA_8B, 16.06 * GB, 131072),
    "qwen3-30b-a3b-4bit": (_QWEN3_30B_A3B, 17.2 * GB, 40960),
    "llama-70b-4bit": (_LLAMA_70B, 39.7 * GB, 131072),
}


def machine(ram_gb: int) -> Machine:
    return Machine(
        ram_bytes=ram_gb * 2**30,
        chip="Apple M",
        cpus=12,
        bandwidth_bytes_per_s=4e11,
        bandwidth_source="published",
        backend="metal",
    )


def size(name: str, ram_gb: int) -> int:
    config, weights, window = MODELS[name.split("#")[0]]
    shape = shape_from_config(config, weights_bytes=int(weights), context_window=window)
    return footprint(
        ModelSpec(name=name, source=name, kv=KvSpec(context=8192)), shape, machine(ram_gb), Settings()
    ).bytes


def resident(ram_gb: int, *names: str, busy: tuple[str, ...] = (), pinned: tuple[str, ...] = ()) -> list[Resident]:
    # Listed oldest first: the first name is the least recently used.
    return [
        Resident(name=name, bytes=size(name, ram_gb), pinned=name in pinned, busy=name in busy, last_used=float(i))
        for i, name in enumerate(names)
    ]


@pytest.mark.parametrize(
    ("ram_gb", "held", "busy", "pinned", "wanted", "expected"),
    [
        pytest.param(16, (), (), (), "llama-8b-4bit", Place(), id="16GB-8b-4bit-alone"),
        pytest.param(
            16, ("llama-8b-4bit",), (), (), "llama-8b-4bit#2", Place(evict=("llama-8b-4bit",)), id="16GB-two-8b-evicts"
        ),
        pytest.param(
            16, ("llama-8b-4bit",), ("llama-8b-4bit",), (), "llama-8b-4bit#2", "wait", id="16GB-busy-8b-waits"
        ),
        pytest.param(16, (), (), (), "llama-8b-bf16", "never", id="16GB-8b-bf16-never"),
        pytest.param(16, (), (), (), "qwen3-30b-a3b-4bit", "never", id="16GB-30b-never"),
        pytest.param(16, (), (), (), "llama-70b-4bit", "never", id="16GB-70b-never"),
        pytest.param(64, ("llama-8b-4bit",), (), (), "qwen3-30b-a3b-4bit", Place(), id="64GB-8b-and-30b"),
        pytest.param(
            64, ("llama-8b-4bit", "qwen3-30b-a3b-4bit"), (), (), "llama-8b-bf16", Place(), id="64GB-three-fit"
        ),
        pytest.param(
            64,
            ("llama-8b-4bit", "qwen3-30b-a3b-4bit"),
            (),
            (),
            "llama-70b-4bit",
            Place(evict=("llama-8b-4bit", "qwen3-30b-a3b-4bit")),
            id="64GB-70b-evicts-both-lru-first",
        ),
        pytest.param(
            64,
            ("qwen3-30b-a3b-4bit", "llama-8b-4bit"),
            (),
            (),
            "llama-8b-bf16#2",
            Place(),
            id="64GB-lru-untouched-when-it-fits",
        ),
        pytest.param(
            64,
            ("llama-8b-4bit", "qwen3-30b-a3b-4bit"),
            (),
            ("llama-8b-4bit",),
            "llama-70b-4bit",
            "never",
            id="64GB-70b-never-beside-a-pinned-8b",
        ),
        pytest.param(
            64,
            ("llama-8b-4bit", "qwen3-30b-a3b-4bit"),
            ("qwen3-30b-a3b-4bit",),
            (),
            "llama-70b-4bit",
            "wait",
            id="64GB-70b-waits-for-a-busy-30b",
        ),
        pytest.param(
            192,
            ("llama-70b-4bit", "qwen3-30b-a3b-4bit", "llama-8b-bf16"),
            (),
            (),
            "llama-8b-4bit",
            Place(),
            id="192GB-all-four",
        ),
        pytest.param(
            192,
            ("llama-70b-4bit", "llama-70b-4bit#2", "llama-70b-4bit#3"),
            (),
            (),
            "qwen3-30b-a3b-4bit",
            Place(),
            id="192GB-three-70b-and-a-30b",
        ),
        pytest.param(
            192,
            ("llama-70b-4bit", "llama-70b-4bit#2", "llama-70b-4bit#3"),
            (),
            (),
            "llama-70b-4bit#4",
            Place(evict=("llama-70b-4bit",)),
            id="192GB-a-fourth-70b-evicts-the-lru-one",
        ),
    ],
)
def test_placement_on_published_models(
    ram_gb: int, held: tuple[str, ...], busy: tuple[str, ...], pinned: tuple[str, ...], wanted: str, expected: object
) -> None:
    budget = fleet_budget(Settings(), machine(ram_gb))
    decision = place(size(wanted, ram_gb), budget=budget, resident=resident(ram_gb, *held, busy=busy, pinned=pinned))
    if expected in ("wait", "never"):
        assert isinstance(decision, Refuse)
        assert decision.permanent is (expected == "never"), decision.reason
    else:
        assert decision == expected


def test_the_footprints_are_the_weights_and_their_kv() -> None:
    """An 8B model at 4 bits holds its weights, 8192 tokens of KV (1 GiB), as much prompt cache, and a prefill chunk."""
    kv_bytes = 32 * 8 * 128 * 2 * 2 * 8192
    assert 4.52 * GB + 2 * kv_bytes < size("llama-8b-4bit", 16) < 4.52 * GB + 2 * kv_bytes + 2 * 2**30


def test_a_budget_set_in_the_file_is_the_footprint() -> None:
    config, weights, window = MODELS["llama-8b-4bit"]
    shape = shape_from_config(config, weights_bytes=int(weights), context_window=window)
    spec = ModelSpec(name="m", source="m", kv=KvSpec(memory_budget=9 * GB))
    assert footprint(spec, shape, machine(64), Settings()).bytes == 9 * GB


def test_a_model_with_quantized_kv_in_the_file_plans_its_kv_at_that_size() -> None:
    """kv_bits = 8 for one model: its footprint's KV shrinks to 8 bits and a scale and bias a group (float16:
    68/128)."""
    config, weights, window = MODELS["llama-8b-4bit"]
    shape = shape_from_config(config, weights_bytes=int(weights), context_window=window)
    full = footprint(ModelSpec(name="m", source="m", kv=KvSpec(context=8192)), shape, machine(16), Settings())
    spec = ModelSpec(name="m", source="m", kv=KvSpec(context=8192, kv_bits=8))
    q8 = footprint(spec, shape, machine(16), Settings())
    kv_bytes = 32 * 8 * 128 * 2 * 2 * 8192
    saved = full.bytes - q8.bytes
    # Both the rows' KV and as much prompt cache are planned at the quantized size.
    assert 0.8 * kv_bytes < saved < 2 * kv_bytes
    # The server's MLX_RELAY_KV_BITS applies where the file says nothing.
    assert (
        footprint(ModelSpec(name="m", source="m", kv=KvSpec(context=8192)), shape, machine(16), Settings(kv_bits=8))
        == q8
    )


def test_a_refusal_says_what_holds_the_memory() -> None:
    decision = place(10, budget=15, resident=[Resident(name="a", bytes=8, pinned=False, busy=True, last_used=0.0)])
    assert isinstance(decision, Refuse) and not decision.permanent and "(a)" in decision.reason


@pytest.mark.parametrize(
    ("model", "now", "gone"),
    [
        pytest.param(
            Resident(name="a", bytes=1, pinned=False, busy=False, last_used=0.0), 10.0, ["a"], id="idle-past-ttl"
        ),
        pytest.param(
            Resident(name="a", bytes=1, pinned=False, busy=False, last_used=0.0), 9.0, [], id="idle-within-ttl"
        ),
        pytest.param(Resident(name="a", bytes=1, pinned=True, busy=False, last_used=0.0), 99.0, [], id="pinned"),
        pytest.param(Resident(name="a", bytes=1, pinned=False, busy=True, last_used=0.0), 99.0, [], id="busy"),
    ],
)
def test_expiry(model: Resident, now: float, gone: list[str]) -> None:
    assert expired([model], {"a": 10.0}, now) == gone


def test_a_model_without_ttl_never_expires() -> None:
    assert expired([Resident(name="a", bytes=1, pinned=False, busy=False, last_used=0.0)], {}, 1e9) == []
