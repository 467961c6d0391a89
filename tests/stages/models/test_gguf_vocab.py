"""stages/models/gguf_vocab.py: SmolLM2's tokenizer rebuilt from its GGUF vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from stages.models.gguf import read_gguf
from stages.models.gguf_vocab import build_tokenizer, tokenizer_config
from stages.models.loading import load_tokenizer, resolve_model
from stages.models.smollm2 import gguf_path

# Ids from an independent conversion of the same GGUF vocabulary:
# transformers 5.25's `AutoTokenizer.from_pretrained(..., gguf_file=...)`.
REFERENCE_IDS = {
    "What is the capital of France?": [1780, 314, 260, 3575, 282, 4649, 47],
    "The year 2024 had 366 days, didn't it?": [
        504,
        713,
        216,
        34,
        32,
        34,
        36,
        761,
        216,
        35,
        38,
        38,
        2009,
        28,
        3683,
        982,
        357,
        47,
    ],
    "  two spaces\tand a tab\n\nnewlines": [216, 827, 5600, 197, 397, 253, 10147, 198, 198, 2241, 5110],
    "héllo wörld — ünïcode ✓ 日本語": [
        88,
        2756,
        31394,
        267,
        29989,
        400,
        1841,
        5549,
        137,
        94,
        25972,
        4635,
        4636,
        246,
        237,
        17097,
        241,
        115,
        40993,
        179,
        120,
        248,
    ],
    "<|im_start|>user\nhi<|im_end|>": [1, 4093, 198, 6004, 2],
    "x=1+2;print(x)  # comment": [104, 45, 33, 27, 34, 43, 3272, 24, 104, 25, 216, 907, 5189],
}


@pytest.fixture(scope="module")
def metadata() -> dict[str, Any]:
    return read_gguf(gguf_path())[1]


@pytest.fixture(scope="module")
def tokenizer(metadata: dict[str, Any]) -> Tokenizer:
    built: Tokenizer = build_tokenizer(metadata)
    return built


@pytest.mark.parametrize("text", REFERENCE_IDS)
def test_sentences_encode_as_the_reference_and_decode_back(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == REFERENCE_IDS[text]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_every_token_is_its_own_id(tokenizer: Tokenizer, metadata: dict[str, Any]) -> None:
    """The vocabulary is the GGUF's token list, id = position, all 49,152 of them."""
    tokens = metadata["tokenizer.ggml.tokens"]
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    assert len(vocab) == len(tokens) == 49152
    assert all(vocab[token] == i for i, token in enumerate(tokens))


def test_control_tokens_are_special_and_vanish_when_skipped(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>assistant\nParis<|im_end|><|endoftext|>").ids
    assert ids[0] == 1 and ids[-2:] == [2, 0]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\nParis"


def test_the_config_names_the_gguf_special_tokens(metadata: dict[str, Any]) -> None:
    config = tokenizer_config(metadata)
    assert (config["bos_token"], config["eos_token"], config["pad_token"], config["unk_token"]) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert config["add_bos_token"] is False and config["model_max_length"] == 8192


@pytest.mark.parametrize(
    ("change", "message"),
    [({"tokenizer.ggml.model": "llama"}, "'llama'"), ({"tokenizer.ggml.pre": "qwen2"}, "'qwen2'")],
)
def test_unknown_vocabularies_are_refused_by_name(
    metadata: dict[str, Any], change: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_tokenizer({**metadata, **change})


def test_the_served_tokenizer_renders_smollm2s_chat_template(smollm2_model: Path) -> None:
    """mlx-lm's wrapper over the converted directory: the GGUF's template, its default system prompt, EOS."""
    tokenizer = load_tokenizer(resolve_model(str(smollm2_model)))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token_ids == {2}
