"""stages/models/gguf_spm.py: Gemma 3's SentencePiece vocabulary rebuilt, held against SentencePiece itself.

The reference is the `sentencepiece` library running a BPE model built
from the same GGUF lists (pieces, scores, types), as Gemma's
tokenizer.model holds them: llama.cpp's converter wrote user-defined
pieces' `▁` as spaces (it matches them in the raw text), so the reference
gets its `▁` back. SentencePiece never matches control pieces in text,
so those are checked on their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from stages.models.gguf_file import read_gguf_file
from stages.models.gguf_spm import USER_DEFINED, build_spm_tokenizer, spm_merges

TEXTS = [
    "The capital of France is",
    "  two spaces\tand a tab\n\nnewlines",
    "héllo wörld — ünïcode ✓ 日本語 🦙",
    "The year 2024 had 366 days, didn't it?",
    "def f(x):\n    return x**2  # square",
    "a\u0000b \U0001f9d1\u200d\U0001f52c   end   ",
    "<b>bold</b> <table><tr><td>1</td></tr></table>",
    " leading space, x\t\t\ty, and   \n  \n",
]


@pytest.fixture(scope="module")
def metadata(gemma3_gguf: Path) -> dict[str, Any]:
    return read_gguf_file(gemma3_gguf).metadata


@pytest.fixture(scope="module")
def tokenizer(metadata: dict[str, Any]) -> Any:
    return build_spm_tokenizer(metadata)


def _sentencepiece(metadata: Mapping[str, Any]) -> Any:
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2

    # Generated protobuf code: its message classes are made at import, unseen by the type checker.
    proto: Any = sentencepiece_model_pb2
    model = proto.ModelProto()
    model.trainer_spec.model_type = proto.TrainerSpec.BPE
    model.trainer_spec.byte_fallback = True
    for role in ("unk", "bos", "eos", "pad"):
        key = {"unk": "unknown", "pad": "padding"}.get(role, role)
        setattr(model.trainer_spec, f"{role}_id", int(metadata[f"tokenizer.ggml.{key}_token_id"]))
    spec = model.normalizer_spec
    spec.name, spec.add_dummy_prefix, spec.remove_extra_whitespaces, spec.escape_whitespaces = "identity", 0, 0, 1
    unknown = int(metadata["tokenizer.ggml.unknown_token_id"])
    pieces = zip(
        metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.scores"], metadata["tokenizer.ggml.token_type"]
    )
    for index, (text, score, kind) in enumerate(pieces):
        piece = model.pieces.add()
        piece.piece = text.replace(" ", "▁") if kind == USER_DEFINED else text
        # SentencePiece's UNKNOWN type: llama.cpp stores <unk> as a control piece.
        piece.score, piece.type = score, 2 if index == unknown else kind
    return sentencepiece.SentencePieceProcessor(model_proto=model.SerializeToString())


def test_texts_tokenize_as_sentencepiece_tokenizes_them(metadata: dict[str, Any], tokenizer: Any) -> None:
    reference = _sentencepiece(metadata)
    for text in TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False).ids == reference.encode(text), text


def test_texts_decode_back_to_themselves(tokenizer: Any) -> None:
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text


def test_turn_markers_are_single_special_tokens(tokenizer: Any) -> None:
    ids = tokenizer.encode("<start_of_turn>user\nHi<end_of_turn>\n", add_special_tokens=False).ids
    assert ids == [105, 2364, 107, 10979, 106, 107]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nHi\n"


def test_bos_starts_a_text_with_special_tokens(tokenizer: Any) -> None:
    assert tokenizer.encode("Hi").ids == [2, 10979]
    assert tokenizer.encode("Hi", add_special_tokens=False).ids == [10979]


def test_merges_rank_by_the_joined_pieces_score() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc", "<ctl>"]
    scores = [0.0, 0.0, 0.0, -3.0, -1.0, -2.0, 0.0]
    types = [1, 1, 1, 1, 1, 1, 3]
    # "abc" splits two ways; "bc" scores best; the control piece joins nothing.
    assert spm_merges(tokens, scores, types) == [("b", "c"), ("a", "bc"), ("ab", "c"), ("a", "b")]
