"""stages/adapters.py and stages/model_thread/adapter_batches.py: which adapter a request names, and rows of
several adapters on one model.

The adapters are random (tests/conftest.py `lora_adapters`); the reference is
mlx-lm itself: `mlx_lm.load(adapter_path=...)` then `mlx_lm.generate`, greedy.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.generate import BatchGenerator

from pipeline.errors import ErrorKind, RequestError
from stages.adapters import AdapterError, ServedModels, read_adapters
from stages.model_thread.adapter_batches import AdapterBatches, build_mounts, make_generator

PROMPTS = ([5, 17, 99, 230, 41, 7], [300, 12, 12, 8], [64, 65, 66, 67, 68, 69, 70, 71, 72])
MAX_TOKENS = 12


def spec(adapters: dict[str, Path]) -> str:
    return ",".join(f"{name}={path}" for name, path in adapters.items())


# -- the list and the names ----------------------------------------------------


def test_the_list_reads_names_paths_and_sizes(lora_adapters: dict[str, Path]) -> None:
    adapters = read_adapters(" " + spec(lora_adapters) + ", ")
    assert [(a.name, a.path, a.fine_tune_type) for a in adapters] == [(n, p, "lora") for n, p in lora_adapters.items()]
    assert all(a.nbytes == (a.path / "adapters.safetensors").stat().st_size > 0 for a in adapters)
    assert read_adapters(None) == read_adapters("") == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("lora-a", "is not name=path"),
        ("=/x", "is not name=path"),
        ("a b=/x", "is not name=path"),
        ("missing=/nonexistent/adapter", "must hold adapter_config.json and adapters.safetensors"),
    ],
)
def test_a_bad_entry_fails_start_up_by_name(entry: str, message: str) -> None:
    with pytest.raises(AdapterError, match=message):
        read_adapters(entry)


def test_a_name_listed_twice_or_a_full_fine_tune_is_refused(lora_adapters: dict[str, Path], tmp_path: Path) -> None:
    path = lora_adapters["lora-a"]
    with pytest.raises(AdapterError, match="twice"):
        read_adapters(f"x={path},x={path}")
    full = tmp_path / "full"
    full.mkdir()
    (full / "adapters.safetensors").write_bytes((path / "adapters.safetensors").read_bytes())
    (full / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "full", "num_layers": 2}))
    with pytest.raises(AdapterError, match="cannot be mounted"):
        read_adapters(f"full={full}")
    (full / "adapter_config.json").write_text(json.dumps({"num_layers": 2}))
    with pytest.raises(AdapterError, match="not an mlx-lm adapter config"):
        read_adapters(f"bad={full}")


def refused(call: Callable[[], object]) -> RequestError:
    with pytest.raises(RequestError) as caught:
        call()
    return caught.value


def test_model_picks_the_adapter_and_an_unknown_name_is_model_not_found(lora_adapters: dict[str, Path]) -> None:
    served = ServedModels(base="tiny", adapters=read_adapters(spec(lora_adapters)))
    assert served.ids == ("tiny", "lora-a", "lora-b")
    assert served.adapter_of({"model": "lora-b"}) == "lora-b"
    assert served.adapter_of({"model": "tiny"}) is None
    assert served.adapter_of({}) is None
    error = refused(lambda: served.adapter_of({"model": "gpt-4o"}))
    assert (error.kind, error.code, error.param) == (ErrorKind.NOT_FOUND, "model_not_found", "model")
    assert "lora-a" in error.message


def test_an_alias_resolves_to_the_id_it_names(lora_adapters: dict[str, Path]) -> None:
    served = ServedModels(
        base="tiny", adapters=read_adapters(spec(lora_adapters)), aliases={"sql": "lora-a", "gpt-4o": "tiny"}
    )
    assert served.knows("sql") and served.knows("gpt-4o") and not served.knows("gpt-5")
    assert served.adapter_of({"model": "sql"}) == "lora-a"
    assert served.adapter_of({"model": "gpt-4o"}) is None
    assert served.adapter_of({"model": "sql", "adapters": "lora-a"}) == "lora-a"
    assert refused(lambda: served.adapter_of({"model": "gpt-5"})).code == "model_not_found"


def test_the_adapters_field_names_an_adapter_by_name_or_path(lora_adapters: dict[str, Path]) -> None:
    served = ServedModels(base="tiny", adapters=read_adapters(spec(lora_adapters)))
    assert served.adapter_of({"model": "tiny", "adapters": "lora-a"}) == "lora-a"
    assert served.adapter_of({"adapters": str(lora_adapters["lora-b"])}) == "lora-b"
    assert served.adapter_of({"model": "lora-a", "adapters": "lora-a"}) == "lora-a"
    unknown = refused(lambda: served.adapter_of({"adapters": "/somewhere/else"}))
    assert (unknown.kind, unknown.code, unknown.param) == (ErrorKind.NOT_FOUND, "model_not_found", "adapters")
    clash = refused(lambda: served.adapter_of({"model": "lora-a", "adapters": "lora-b"}))
    assert (clash.kind, clash.param) == (ErrorKind.INVALID_REQUEST, "adapters")
    assert refused(lambda: served.adapter_of({"adapters": ["lora-a"]})).param == "adapters"


def test_without_adapters_any_model_is_the_base_and_the_adapters_field_is_refused() -> None:
    served = ServedModels(base="tiny")
    assert served.adapter_of({"model": "gpt-4o"}) is None
    error = refused(lambda: served.adapter_of({"model": "gpt-4o", "adapters": "sql-lora"}))
    assert (error.kind, error.code, error.param) == (ErrorKind.NOT_FOUND, "model_not_found", "adapters")


# -- rows of several adapters on one model ---------------------------------------


def reference(model_path: Path, adapter: Path | None, prompt: list[int]) -> list[int]:
    """Greedy tokens of `mlx_lm.generate` with the adapter loaded as mlx-lm loads it."""
    model, tokenizer = mlx_lm.load(str(model_path), adapter_path=str(adapter) if adapter else None)
    tokens = []
    for response in mlx_lm.stream_generate(model, tokenizer, prompt=prompt, max_tokens=MAX_TOKENS):
        tokens.append(response.token)
    return tokens


def batches(model_path: Path, adapters: dict[str, Path]) -> tuple[Any, Any, AdapterBatches]:
    model, tokenizer = mlx_lm.load(str(model_path))
    make = partial(
        BatchGenerator,
        model,
        stop_tokens=[[t] for t in tokenizer.eos_token_ids],
        completion_batch_size=8,
        prefill_batch_size=8,
    )
    generator = make_generator(model, read_adapters(spec(adapters)), make)
    assert isinstance(generator, AdapterBatches)
    return model, tokenizer, generator


def run(
    generator: AdapterBatches, rows: list[tuple[str | None, list[int]]]
) -> tuple[dict[int, list[int]], list[set[int]]]:
    """Each row's tokens, and which rows produced a token at each step."""
    uids = [
        generator.insert([prompt], max_tokens=[MAX_TOKENS], **({"adapter": name} if name else {}))[0]
        for name, prompt in rows
    ]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    steps, live = [], set(uids)
    while live:
        _, generated = generator.next()
        steps.append({response.uid for response in generated})
        for response in generated:
            tokens[response.uid].append(response.token)
            if response.finish_reason is not None:
                live.discard(response.uid)
    return {uids.index(uid): found for uid, found in tokens.items()}, steps


def test_mixed_rows_each_equal_mlx_lm_with_their_adapter(tiny_model: Path, lora_adapters: dict[str, Path]) -> None:
    """Base and two adapters in one generator: every row's greedy tokens equal mlx_lm.generate's with its adapter
    alone."""
    rows: list[tuple[str | None, list[int]]] = [
        (name, prompt) for prompt in PROMPTS[:2] for name in (None, "lora-a", "lora-b")
    ]
    _, _, generator = batches(tiny_model, lora_adapters)
    found, _ = run(generator, rows)
    expected = {(name, tuple(p)): reference(tiny_model, lora_adapters[name] if name else None, p) for name, p in rows}
    for index, (name, prompt) in enumerate(rows):
        assert found[index] == expected[name, tuple(prompt)], (name, prompt)
    # The adapters change the output (their B matrices are not zero).
    for prompt in PROMPTS[:2]:
        assert len({tuple(expected[name, tuple(prompt)]) for name in (None, "lora-a", "lora-b")}) == 3


def test_busy_groups_take_turns_one_step_each(tiny_model: Path, lora_adapters: dict[str, Path]) -> None:
    """With three groups busy, a step runs one group, and each runs once in every three steps."""
    _, _, generator = batches(tiny_model, lora_adapters)
    found, steps = run(
        generator, [(None, PROMPTS[0]), ("lora-a", PROMPTS[0]), ("lora-a", PROMPTS[1]), ("lora-b", PROMPTS[2])]
    )
    groups = {0: "base", 1: "a", 2: "a", 3: "b"}
    turns = [{groups[uid] for uid in step} for step in steps if step]
    assert all(len(turn) == 1 for turn in turns)
    busy = [turn.pop() for turn in turns[: 3 * (MAX_TOKENS - 1)]]
    assert all(len(set(busy[i : i + 3])) == 3 for i in range(0, len(busy) - 2, 3))
    assert generator.switches >= len(busy) - 1 and all(len(tokens) == MAX_TOKENS for tokens in found.values())


def test_removed_rows_hand_back_their_cache_and_the_model_is_left_as_loaded(
    tiny_model: Path, lora_adapters: dict[str, Path]
) -> None:
    """remove() finds each row in its group; close() leaves the base layers mounted, so the base output is unchanged."""
    model, _, generator = batches(tiny_model, lora_adapters)
    base_logits = model(mx.array([PROMPTS[0]]))
    uids = [generator.insert([PROMPTS[0]], max_tokens=[MAX_TOKENS], **kw)[0] for kw in ({}, {"adapter": "lora-a"})]
    for _ in range(8):
        generator.next()
    caches = generator.remove(uids, return_prompt_caches=True)
    # Each row's cache holds its prompt and what it generated so far.
    assert set(caches) == set(uids) and all(len(tokens) > len(PROMPTS[0]) for _, tokens in caches.values())
    assert generator.next() == ([], [])
    generator.close()
    assert mx.array_equal(model(mx.array([PROMPTS[0]])), base_logits)


def test_mounts_share_the_base_weights(tiny_model: Path, lora_adapters: dict[str, Path]) -> None:
    """An adapter's layers wrap the model's own: mounting adds only A and B."""
    model, _ = mlx_lm.load(str(tiny_model))
    base, mounts = build_mounts(model, read_adapters(spec(lora_adapters)))
    originals = dict(base)
    for layers in mounts.values():
        assert layers and all(module.linear is originals[name] for name, module in layers)


def test_the_memory_plan_counts_adapter_weights(tiny_model: Path) -> None:
    """Adapters held beside the model count as weights in the start-up plan."""
    from stages.kv.plan import assess

    def weights(extra: int) -> int:
        plan = assess(
            tiny_model,
            context_window=2048,
            budget=1 << 30,
            prompt_cache=0,
            max_batch=4,
            prefill_step=256,
            adapter_bytes=extra,
        )
        return plan.memory.weights_bytes

    assert weights(123_456) == weights(0) + 123_456
