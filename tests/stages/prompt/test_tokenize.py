"""stages/prompt/tokenize.py: the byte bound never overshoots, and pieces tokenize as the whole text does."""

from __future__ import annotations

import itertools
import random

import pytest

from stages.messages import PromptText
from stages.models.loading import Tokenizer
from stages.prompt.tokenize import PIECE_CHARS, BoundedEncoder, split_text

WORDS = ["hello", "world", "\n", "  ", "x=1", "数字", ":\n", "\n\n", "{", "}", "\t", "é", "<|im_start|>", "123456"]


def random_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(WORDS) + rng.choice([" ", ""]) for _ in range(words))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("specials", [False, True])
def test_pieces_tokenize_as_the_whole_text(tokenizer: Tokenizer, seed: int, specials: bool) -> None:
    """Split at newline boundaries, the demo tokenizer's pieces join into exactly the whole text's tokens."""
    encoder = BoundedEncoder.of(tokenizer)
    assert encoder.piece_safe
    prompt = PromptText(random_text(seed, 12_000), add_special_tokens=specials)
    pieces = list(encoder.pieces(prompt))
    assert len(pieces) > 2
    tokens = [token for piece in pieces for token in encoder.encode(piece)]
    assert tokens == tokenizer.encode(prompt.text, add_special_tokens=specials)


@pytest.mark.parametrize("seed", range(5))
def test_the_byte_bound_is_a_lower_bound(tokenizer: Tokenizer, seed: int) -> None:
    """No text has fewer tokens than its bytes over the longest token's bytes."""
    encoder = BoundedEncoder.of(tokenizer)
    for text in (random_text(seed, 500), "a" * 5000, " " * 5000, "é" * 3000, "<|im_start|>" * 100):
        prompt = PromptText(text, add_special_tokens=False)
        assert encoder.min_tokens(prompt) <= len(tokenizer.encode(text, add_special_tokens=False))


def test_split_text_cuts_only_after_a_newline_before_a_non_space() -> None:
    """Every piece but the first starts with a non-space after a newline; nothing is lost."""
    text = ("line of text\n  indented\n\n" * 2000) + "tail"
    pieces = split_text(text, PIECE_CHARS)
    assert "".join(pieces) == text and len(pieces) > 1
    for before, after in itertools.pairwise(pieces):
        assert before.endswith("\n") and not after[0].isspace() and len(before) >= PIECE_CHARS
