"""A dedicated embedding model: reading its pooling and Matryoshka sizes, loading its published layout, its vectors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from stages.engine.work_service import _judgement
from stages.model_thread.embed import EmbedWork, SideModel
from stages.models.embedding import (
    EmbeddingModelError,
    Matryoshka,
    allowed_dimensions,
    load_embedding_weights,
    read_embedding_model,
)
from stages.models.loading import Tokenizer, load_tokenizer
from stages.models.mlx_internals import final_hidden
from stages.models.shaped_embedding import ensure_embedding_model
from stages.prompt.chat import render_chat_text

NAME = "qwen3-embedding-0.6b-2l"


@pytest.fixture(scope="module")
def built() -> Path:
    return ensure_embedding_model(NAME)


def _copy(built: Path, tmp_path: Path, **config: object) -> Path:
    """The model's directory with its config changed; the weights are linked, not copied."""
    dest = tmp_path / "model"
    shutil.copytree(built, dest, ignore=shutil.ignore_patterns("model.safetensors"))
    (dest / "model.safetensors").symlink_to(built / "model.safetensors")
    path = dest / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return dest


def test_the_published_layout_is_read_as_qwen3_embedding_is(built: Path) -> None:
    """Last-token pooling from 1_Pooling/, no Matryoshka declared, headless weights (no lm_head, no `model.` prefix)."""
    model = read_embedding_model(str(built), fallback="mean", matryoshka=None)
    assert (model.pooling, model.hidden_size, model.matryoshka, model.headless) == ("last", 1024, None, True)
    assert model.nbytes == (built / "model.safetensors").stat().st_size


def test_pooling_falls_back_to_the_setting_without_sentence_transformers_files(built: Path, tmp_path: Path) -> None:
    path = _copy(built, tmp_path)
    (path / "modules.json").unlink()
    assert read_embedding_model(str(path), fallback="mean", matryoshka=None).pooling == "mean"


def test_a_pooling_a_causal_model_cannot_give_is_refused(built: Path, tmp_path: Path) -> None:
    path = _copy(built, tmp_path)
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(EmbeddingModelError, match="pooling_mode_cls_token"):
        read_embedding_model(str(path), fallback="last", matryoshka=None)


def test_an_encoder_is_refused_by_name(built: Path, tmp_path: Path) -> None:
    path = _copy(built, tmp_path, model_type="bert")
    with pytest.raises(EmbeddingModelError, match="encoder"):
        read_embedding_model(str(path), fallback="last", matryoshka=None)


@pytest.mark.parametrize(
    ("config", "setting", "expected"),
    [
        ({}, None, None),
        ({"is_matryoshka": True}, None, Matryoshka()),
        ({"matryoshka_dimensions": [512, 256]}, None, Matryoshka(sizes=(256, 512))),
        ({}, "any", Matryoshka()),
        ({"matryoshka_dimensions": [512]}, "64, 128", Matryoshka(sizes=(64, 128))),
    ],
)
def test_matryoshka_sizes_are_read_as_vllm_reads_them(
    built: Path, tmp_path: Path, config: dict[str, object], setting: str | None, expected: Matryoshka | None
) -> None:
    """The config's `matryoshka_dimensions` (those sizes) or `is_matryoshka` (any); the setting overrides both."""
    path = _copy(built, tmp_path, **config)
    assert read_embedding_model(str(path), fallback="last", matryoshka=setting).matryoshka == expected


@pytest.mark.parametrize("setting", ["some", "0,64", "64,4096"])
def test_a_bad_matryoshka_setting_is_refused(built: Path, setting: str) -> None:
    with pytest.raises(EmbeddingModelError, match="MLX_RELAY_EMBEDDING_MATRYOSHKA"):
        read_embedding_model(str(built), fallback="last", matryoshka=setting)


@pytest.mark.parametrize(
    ("matryoshka", "dimensions", "refused"),
    [
        (None, 1024, None),
        (None, 256, "does not support Matryoshka"),
        (Matryoshka(), 32, None),
        (Matryoshka(), 2048, "1024 dimensions"),
        (Matryoshka(sizes=(256, 512)), 512, None),
        (Matryoshka(sizes=(256, 512)), 300, "only these sizes: 256, 512"),
    ],
)
def test_allowed_dimensions(matryoshka: Matryoshka | None, dimensions: int, refused: str | None) -> None:
    reason = allowed_dimensions(matryoshka, dimensions, 1024)
    assert reason == refused if refused is None else refused in (reason or "")


def test_vectors_are_the_last_tokens_normalized_hidden_state_and_truncate_then_renormalize(built: Path) -> None:
    """Inputs of different lengths in one padded batch give each input's own last-token state, as run alone."""
    spec = read_embedding_model(str(built), fallback="mean", matryoshka="any")
    side = SideModel(load=lambda: load_embedding_weights(spec))
    inputs = [(5, 6, 7), (9, 10, 11, 12, 13, 14), (40,)]
    work = EmbedWork(inputs=inputs, pooling="last", side=side)
    while work.remaining():
        work.run_chunk(None, 4)
    vectors = work.result()
    for tokens, vector in zip(inputs, vectors):
        hidden = final_hidden(side.get(), mx.array([tokens]))[0, -1].astype(mx.float32)
        reference = np.array(hidden / mx.linalg.norm(hidden))
        np.testing.assert_allclose(vector, reference, atol=1e-4)
    short = EmbedWork(inputs=inputs, pooling="last", side=side, dimensions=64)
    short.run_chunk(None, 10**6)
    for full, cut in zip(vectors, short.result()):
        np.testing.assert_allclose(cut, full[:64] / np.linalg.norm(full[:64]), atol=1e-5)


def test_the_judgement_prompt_is_qwen3_rerankers_format(tokenizer: Tokenizer) -> None:
    """Through a Qwen3-style template (ChatML, thinking off) the prompt is the model card's prefix + instruction +
    suffix."""
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    body = (
        "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
        "<Query>: tides\n<Document>: the sea"
    )
    assert render_chat_text(tokenizer, _judgement("tides", "the sea")).text == prefix + body + suffix


def test_the_tokenizer_loads_like_the_chat_models(built: Path) -> None:
    spec = read_embedding_model(str(built), fallback="last", matryoshka=None)
    assert load_tokenizer(spec.info).encode("hello world")


def test_a_judgement_on_the_dedicated_model_runs_that_model(built: Path) -> None:
    """`ScoreWork` with a side model reads that model's head at the prompt's last token, whatever the gateway passes."""
    from stages.model_thread.embed import ScoreWork
    from stages.models.mlx_internals import head_logits

    spec = read_embedding_model(str(built), fallback="last", matryoshka=None)
    tokenizer = load_tokenizer(spec.info)
    side = SideModel(load=lambda: load_embedding_weights(spec))
    prompts = [
        tokenizer.encode(render_chat_text(tokenizer, _judgement("tides", doc)).text) for doc in ("the sea", "a cat")
    ]
    yes, no = tokenizer.encode("yes")[0], tokenizer.encode("no")[0]
    work = ScoreWork(inputs=prompts, yes=yes, no=no, side=side)
    work.run_chunk(None, 10**6)
    for prompt, score in zip(prompts, work.result()):
        logits = head_logits(side.get(), final_hidden(side.get(), mx.array([prompt]))[:, -1])[0].astype(mx.float32)
        expected = float(mx.sigmoid(logits[yes] - logits[no]))
        assert score == pytest.approx(expected, abs=1e-5)
