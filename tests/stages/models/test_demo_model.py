"""stages/models/demo.py: the project's own model, built locally, read by mlx-lm like any other."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten

from stages.models.demo import (
    BUILDER_VERSION,
    DEMO_MODELS,
    EOS_TOKENS,
    MARKER_TOKENS,
    SPECIAL_TOKENS,
    ensure_demo_model,
)
from stages.models.loading import ModelInfo, Tokenizer

FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


def test_the_tiny_model_is_an_ordinary_mlx_lm_directory(tiny_model: Path) -> None:
    """mlx_lm.load reads the demo directory and the model runs a forward pass over the whole vocabulary."""
    assert tiny_model.name == f"tiny-{BUILDER_VERSION}"
    assert {path.name for path in tiny_model.iterdir()} >= FILES
    model = mlx_lm.load(str(tiny_model))[0]
    logits = model(mx.array([[1, 2, 3]]))
    assert logits.shape == (1, 3, DEMO_MODELS["tiny"].vocab_size)


def test_resolve_model_reads_the_window_and_vocabulary(model_info: ModelInfo, tiny_model: Path) -> None:
    """The stages get the context window and vocabulary size from the model's own config."""
    spec = DEMO_MODELS["tiny"]
    assert (model_info.path, model_info.context_window, model_info.vocab_size) == (
        tiny_model,
        spec.max_position_embeddings,
        spec.vocab_size,
    )


@pytest.mark.parametrize("marker", MARKER_TOKENS)
def test_markers_are_single_tokens_kept_in_text(tokenizer: Tokenizer, marker: str) -> None:
    """<think>, </think>, <tool_call>, </tool_call> are one token each and decode back to themselves."""
    tokens = tokenizer.encode(marker)
    assert len(tokens) == 1
    assert tokenizer.decode(tokens) == marker
    assert tokens[0] in tokenizer.encode(f"say {marker} now")


@pytest.mark.parametrize("special", SPECIAL_TOKENS)
def test_special_tokens_are_single_tokens(tokenizer: Tokenizer, special: str) -> None:
    """The ChatML control tokens are single tokens."""
    assert len(tokenizer.encode(special)) == 1


def test_eos_ids_are_im_end_and_endoftext(tokenizer: Tokenizer) -> None:
    """Generation stops at <|im_end|> or <|endoftext|>, and at nothing else."""
    assert set(tokenizer.eos_token_ids) == {tokenizer.encode(token)[0] for token in EOS_TOKENS}
    assert len(tokenizer.eos_token_ids) == 2


def test_there_is_no_bos(tokenizer: Tokenizer) -> None:
    """Encoding adds no control token: every id of plain text is the text's own."""
    control = {tokenizer.encode(token)[0] for token in SPECIAL_TOKENS}
    tokens = tokenizer.encode("Hello")
    assert not control & set(tokens)
    assert tokenizer.decode(tokens[:1]) != ""


def test_control_tokens_have_zero_output_rows(tiny_model: Path, tokenizer: Tokenizer) -> None:
    """Greedy decoding never picks a control token: their lm_head rows are zero."""
    weights = mx.load(str(tiny_model / "model.safetensors"))
    assert isinstance(weights, dict)
    head = weights["lm_head.weight"]
    for token in SPECIAL_TOKENS + MARKER_TOKENS:
        (token_id,) = tokenizer.encode(token)
        assert float(mx.abs(head[token_id]).max().item()) == 0.0
    assert float(mx.abs(head[100]).max().item()) > 0.0


def test_the_parameter_count_formula_matches_the_built_model(tiny_model: Path) -> None:
    """DemoSpec.parameter_count() is the number of parameters mlx-lm actually loads."""
    model = mlx_lm.load(str(tiny_model))[0]
    loaded = sum(value.size for _, value in tree_flatten(model.parameters()))
    assert loaded == DEMO_MODELS["tiny"].parameter_count()


def test_the_demo_model_has_tens_of_millions_of_parameters() -> None:
    """ "demo" is big enough that batching decode steps pays, small enough for a laptop."""
    assert 10_000_000 <= DEMO_MODELS["demo"].parameter_count() < 100_000_000


def test_builds_are_byte_identical_and_cached(tmp_path: Path) -> None:
    """Two fresh builds give the same bytes in every file; a second call reuses the cache and leaves no staging dir."""
    first = ensure_demo_model("tiny", tmp_path / "a")
    second = ensure_demo_model("tiny", tmp_path / "b")
    assert {p.name for p in first.iterdir()} == {p.name for p in second.iterdir()} == FILES
    for name in sorted(FILES):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_demo_model("tiny", tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "a").iterdir()] == [first.name]
    config = json.loads((first / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"]) == ("llama", DEMO_MODELS["tiny"].vocab_size)


def test_the_cache_root_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$MLX_RELAY_DEMO_CACHE moves the cache; the built directory is published there."""
    monkeypatch.setenv("MLX_RELAY_DEMO_CACHE", str(tmp_path))
    assert ensure_demo_model("tiny") == tmp_path / f"tiny-{BUILDER_VERSION}"


def test_an_unknown_demo_model_is_refused(tmp_path: Path) -> None:
    """Asking for a demo model that does not exist fails before anything is written."""
    with pytest.raises(ValueError, match="unknown demo model 'huge'"):
        ensure_demo_model("huge", tmp_path)
    assert list(tmp_path.iterdir()) == []
