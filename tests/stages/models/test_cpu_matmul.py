"""stages/models/cpu_matmul.py: a linear layer's product in the orientation measured faster gives the same answer,
and is kept only where the measuring found it faster."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from stages.models import cpu_exp, cpu_matmul
from stages.models.loading import load_tokenizer, load_weights, resolve_model

pytestmark = pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the CPU backend's matmuls")


def close(ours: mx.array, theirs: mx.array) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=2e-5)


class Tied(nn.Module):
    """A model whose embedding is its output projection (no `lm_head`), as SmolLM2's and Gemma 3's are."""

    def __init__(self, width: int, vocabulary: int, layers: int, dtype: mx.Dtype = mx.float32) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocabulary, width)
        self.layers = [nn.Linear(width, 2 * width, bias=index % 2 == 0) for index in range(layers)]
        self.down = nn.Linear(2 * width, width, bias=False)
        self.set_dtype(dtype)

    def __call__(self, tokens: mx.array) -> mx.array:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = x + self.down(layer(x))
        return self.embed_tokens.as_linear(x)


@pytest.fixture(autouse=True)
def nothing_measured_yet(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    kept = tmp_path / "cpu_matmul.json"
    monkeypatch.setattr(cpu_matmul, "_measured", {})
    monkeypatch.setattr(cpu_matmul, "kept_path", lambda: kept)
    return kept


@pytest.mark.parametrize("shape", [(1, 576), (3, 576), (2, 3, 576), (4, 1, 576), (8, 576)])
def test_the_flipped_product_is_the_product(shape: tuple[int, ...]) -> None:
    x, weight = mx.random.normal(shape), mx.random.normal((1536, 576)) / 24
    close(cpu_matmul.flipped_product(x, weight), x @ weight.T)


@pytest.mark.parametrize("bias", [False, True])
def test_an_oriented_linear_answers_as_the_linear_at_every_row_count(
    bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    linear = nn.Linear(640, 1024, bias=bias)
    inputs = {rows: mx.random.normal((rows, 640)) for rows in range(1, 7)}
    theirs = {rows: linear(x) for rows, x in inputs.items()}
    flipped = counting_flips(monkeypatch)
    linear.__class__ = cpu_matmul.OrientedLinear
    linear.flipped_rows = frozenset({2, 3, 4})
    for rows, x in inputs.items():
        close(linear(x), theirs[rows])
    assert flipped == [2, 3, 4]


def test_an_oriented_embedding_projects_as_the_embedding_and_looks_up_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    embedding = nn.Embedding(4096, 256)
    x, tokens = mx.random.normal((1, 3, 256)), mx.array([[5, 4095, 0]])
    theirs, looked_up = embedding.as_linear(x), embedding(tokens)
    flipped = counting_flips(monkeypatch)
    embedding.__class__ = cpu_matmul.OrientedEmbedding
    embedding.flipped_rows = frozenset({3})
    close(embedding.as_linear(x), theirs)
    assert flipped == [3]
    assert mx.array_equal(embedding(tokens), looked_up).item()


def test_a_large_model_is_measured_and_answers_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Tied(width=1024, vocabulary=8192, layers=4)
    assert cpu_matmul.weight_bytes([model.embed_tokens, *model.layers, model.down]) >= cpu_matmul._LEAST_WEIGHT_BYTES
    inputs = {rows: mx.random.randint(0, 8192, (1, rows)) for rows in range(1, 10)}
    theirs = {rows: model(tokens) for rows, tokens in inputs.items()}
    mx.eval(theirs)
    chosen = cpu_matmul.install(model)
    # Every shape measured, each row count's choice within what is measured; then reused, not measured again.
    assert set(chosen) == {(2048, 1024), (1024, 2048), (8192, 1024)}
    assert all(set(rows) <= set(cpu_matmul._MEASURED_ROWS) for rows in chosen.values())
    assert all(type(layer) is cpu_matmul.OrientedLinear for layer in [*model.layers, model.down])
    assert type(model.embed_tokens) is cpu_matmul.OrientedEmbedding
    assert model.embed_tokens.flipped_rows == frozenset(chosen[(8192, 1024)])
    monkeypatch.setattr(cpu_matmul, "flipped_rows", unexpected)
    assert cpu_matmul.install(Tied(width=1024, vocabulary=8192, layers=4)) == chosen
    # Whatever was chosen, the answers hold at every row count; with every one flipped too.
    for every in (False, True):
        for layer in [model.embed_tokens, *model.layers, model.down]:
            layer.flipped_rows = frozenset(range(1, 10)) if every else layer.flipped_rows
        for rows, tokens in inputs.items():
            np.testing.assert_allclose(np.asarray(model(tokens)), np.asarray(theirs[rows]), rtol=1e-4, atol=1e-4)


def test_what_was_measured_is_kept_for_this_machine_and_read_by_the_next_process(
    nothing_measured_yet: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = cpu_matmul.install(Tied(width=1024, vocabulary=8192, layers=4))
    kept = json.loads(nothing_measured_yet.read_text())
    assert kept == {cpu_matmul.machine(): {f"{o}x{i}": list(rows) for (o, i), rows in sorted(chosen.items())}}
    # A later process (nothing measured in it) reads the file and measures nothing.
    monkeypatch.setattr(cpu_matmul, "_measured", {})
    monkeypatch.setattr(cpu_matmul, "flipped_rows", unexpected)
    assert cpu_matmul.install(Tied(width=1024, vocabulary=8192, layers=4)) == chosen
    # Another machine's entry (another BLAS, thread count, CPU or MLX) is not this one's: measured, and both kept.
    monkeypatch.setattr(cpu_matmul, "_measured", {})
    monkeypatch.setattr(cpu_matmul, "machine", lambda: "another machine")
    monkeypatch.setattr(cpu_matmul, "flipped_rows", lambda weights: frozenset({2}))
    assert set(cpu_matmul.install(Tied(width=1024, vocabulary=8192, layers=4)).values()) == {(2,)}
    assert len(json.loads(nothing_measured_yet.read_text())) == 2


def test_the_machine_is_named_where_the_os_has_no_affinity_call(monkeypatch: pytest.MonkeyPatch) -> None:
    named = cpu_matmul.machine()
    monkeypatch.delattr(cpu_matmul.os, "sched_getaffinity", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert f"; {os.cpu_count()} threads; " in cpu_matmul.machine()
    assert named.split("; rows ")[1] == cpu_matmul.machine().split("; rows ")[1]


def test_a_kept_file_that_does_not_read_is_measured_again(nothing_measured_yet: Path) -> None:
    nothing_measured_yet.write_text("{not json")
    chosen = cpu_matmul.install(Tied(width=1024, vocabulary=8192, layers=4))
    assert set(chosen) == {(2048, 1024), (1024, 2048), (8192, 1024)}
    assert cpu_matmul.machine() in json.loads(nothing_measured_yet.read_text())


def test_an_untied_model_s_embedding_is_not_a_projection() -> None:
    model = Tied(width=1024, vocabulary=8192, layers=4)
    model.lm_head = nn.Linear(1024, 8192, bias=False)
    chosen = cpu_matmul.install(model)
    assert type(model.embed_tokens) is nn.Embedding and type(model.lm_head) is cpu_matmul.OrientedLinear
    assert (8192, 1024) in chosen


@pytest.mark.parametrize("why", ["small", "sixteen-bit", "mlx asked for"])
def test_a_small_model_sixteen_bit_weights_or_mlx_s_own_asked_for_are_left_alone(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = {
        "small": lambda: Tied(width=256, vocabulary=1024, layers=2),
        "sixteen-bit": lambda: Tied(width=1024, vocabulary=8192, layers=4, dtype=mx.float16),
        "mlx asked for": lambda: Tied(width=1024, vocabulary=8192, layers=4),
    }[why]()
    if why == "mlx asked for":
        monkeypatch.setenv(cpu_exp.CHOICE_VARIABLE, "mlx")
    monkeypatch.setattr(cpu_matmul, "flipped_rows", unexpected)
    assert cpu_matmul.install(model) == {}
    assert type(model.embed_tokens) is nn.Embedding and all(type(layer) is nn.Linear for layer in model.layers)


@pytest.mark.parametrize(("call", "kept"), [(0.005, {3, 4, 6, 7, 16}), (0.05, {3, 4, 6, 16})], ids=["short", "long"])
def test_the_flipped_product_is_kept_only_where_its_fastest_round_is_clearly_faster(
    call: float, kept: set[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clock that reads the work asked of it: each orientation's time by row count and round, in units of `call`
    # (MLX's first call, which decides whether a call is long: three rounds each if not, two if so). A burst slows
    # one of the flipped product's rounds at 6 rows (hiding nothing) and two of MLX's at 5 (faking nothing).
    ours = {
        2: [1.0],
        3: [0.5],
        4: [0.8],
        5: [0.9],
        6: [3.0, 0.5, 0.6],
        7: [0.86, 0.86, 0.84],
        8: [0.86],
        16: [0.7],
        32: [1.1],
    }
    theirs = {5: [1.0, 3.0, 3.0]}
    rounds: dict[tuple[str, int], int] = {}

    def seconds(run: Callable[[], list[mx.array]]) -> float:
        rows = run()[0].shape[0]
        times = ours.get(rows, [1.0]) if run.__name__ == "ours" else theirs.get(rows, [1.0])
        taken = rounds.get((run.__name__, rows), 0)
        rounds[(run.__name__, rows)] = taken + 1
        return times[taken % len(times)] * call

    monkeypatch.setattr(cpu_matmul, "_seconds", seconds)
    assert cpu_matmul.flipped_rows([mx.zeros((64, 32))]) == frozenset(kept)


@pytest.mark.parametrize("built_in", ["smollm2_model", "gemma3_model"])
def test_a_real_model_with_every_product_flipped_reads_as_with_mlx_s_products(
    built_in: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real model as the server loads it on a CPU (the measuring itself skipped: the rows are set below), then every
    # linear layer and the tied output projection flipped at every row count, against none flipped, over 3 prompts
    # (24 rows, a prefill's) and a decode step of them (3 rows, where MKL's own kernel is slowest).
    monkeypatch.setattr(cpu_matmul, "flipped_rows", lambda weights: frozenset())
    info = resolve_model(str(request.getfixturevalue(built_in)))
    model = load_weights(attrs.evolve(info, float32_weights=True))
    layers = [module for _, module in model.named_modules() if hasattr(module, "flipped_rows")]
    assert len(layers) == len(model.layers) * 7 + 1
    tokenizer = load_tokenizer(info)
    prompts = [
        tokenizer.encode(f"The {n} largest cities of France, by their people, are")[:8]
        for n in ("two", "three", "four")
    ]
    read = {}
    for flipped in (frozenset(), frozenset(range(1, 40))):
        for layer in layers:
            layer.flipped_rows = flipped
        cache = make_prompt_cache(model)
        logits = [model(mx.array(prompts), cache=cache)[:, -1]]
        logits.append(model(mx.argmax(logits[-1], axis=-1)[:, None], cache=cache)[:, -1])
        read[bool(flipped)] = [np.asarray(step) for step in logits]
    for ours, theirs in zip(read[True], read[False], strict=True):
        np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)
        assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def counting_flips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    flipped: list[int] = []
    product = cpu_matmul.flipped_product

    def counted(x: mx.array, weight: mx.array) -> mx.array:
        flipped.append(x.size // x.shape[-1])
        return product(x, weight)

    monkeypatch.setattr(cpu_matmul, "flipped_product", counted)
    return flipped


def unexpected(weights: object) -> frozenset[int]:
    raise AssertionError("measured where nothing was to be measured")
