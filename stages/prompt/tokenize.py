"""Bounded tokenization: cheap refusals first, then the prompt in pieces.

A prompt's bytes bound its tokens from below: no token covers more bytes
than the vocabulary's longest entry, so a prompt of `n` bytes has at least
`ceil(n / longest)` tokens. The entry is measured as its UTF-8 string,
which is never shorter than the bytes the token stands for (a byte-level
vocabulary writes each byte as one character of one or two bytes;
SentencePiece writes a space as the three-byte `▁` and a fallback byte as
`<0xNN>`), so the bound only errs towards letting a prompt through. A
prompt whose bound is already past the context window is refused before
any tokenizer work.

A prompt that passes is encoded in pieces of about `PIECE_CHARS`,
split after a newline that a non-space follows. BPE never merges across
such a point for the byte-level pre-tokenizers of GPT-2, Llama 3 and Qwen,
so the pieces' tokens are the whole text's; a tokenizer for which a probe
at load shows otherwise (a SentencePiece prefix space, a normalizer) is
encoded whole. Between pieces the caller can let other requests tokenize,
and can stop as soon as the count is past the window.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import attrs

from stages.messages import PromptText
from stages.models.loading import Tokenizer

# About 2-10 ms of tokenizer work per piece: short enough for a piece
# boundary to come around often, long enough that the hand-offs cost little.
PIECE_CHARS = 16_384
# A point after a newline and before a non-space character.
_BOUNDARY = re.compile(r"(?<=\n)(?=\S)")
# Texts whose boundaries must split cleanly for a tokenizer to be encoded in pieces.
_PROBES = (
    "Hello world.\nNext line here\n\nThird paragraph, with words.",
    "def f(x):\n    return x * 2\nresult = f(21)\n",
    '数字123\n456 abc\n}\n{"a": 1}\n- item\n<tag>\n',
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
)


@attrs.define
class BoundedEncoder:
    """One tokenizer's bounds: its longest token, and whether pieces split cleanly."""

    tokenizer: Tokenizer
    longest_token_bytes: int
    piece_safe: bool
    # What `add_special_tokens=True` puts before the text, when it adds nothing after.
    special_prefix: tuple[int, ...] | None

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> BoundedEncoder:
        return cls(tokenizer, _longest_token_bytes(tokenizer), _splits_cleanly(tokenizer), _special_prefix(tokenizer))

    def min_tokens(self, prompt: PromptText) -> int:
        """A lower bound on the prompt's tokens, from its length alone (specials not counted)."""
        return math.ceil(len(prompt.text.encode()) / self.longest_token_bytes)

    def pieces(self, prompt: PromptText) -> Iterator[PromptText]:
        """The prompt as texts to encode one by one; their tokens, joined, are the prompt's."""
        if (
            not self.piece_safe
            or len(prompt.text) <= PIECE_CHARS
            or (prompt.add_special_tokens and self.special_prefix is None)
        ):
            yield prompt
            return
        if prompt.add_special_tokens:
            yield PromptText("", add_special_tokens=True)
        yield from (PromptText(text, add_special_tokens=False) for text in split_text(prompt.text, PIECE_CHARS))

    def encode(self, piece: PromptText) -> list[int]:
        if piece.add_special_tokens and not piece.text and self.special_prefix is not None:
            return list(self.special_prefix)
        return self.tokenizer.encode(piece.text, add_special_tokens=piece.add_special_tokens)


def split_text(text: str, size: int) -> list[str]:
    """`text` cut at newline boundaries into pieces of at least `size` characters (the last may be shorter)."""
    pieces, start = [], 0
    while len(text) - start > size:
        found = _BOUNDARY.search(text, start + size)
        if found is None:
            break
        pieces.append(text[start : found.start()])
        start = found.start()
    pieces.append(text[start:])
    return pieces


def _longest_token_bytes(tokenizer: Tokenizer) -> int:
    hf: Any = getattr(tokenizer, "_tokenizer", tokenizer)
    vocab: dict[str, int] = hf.get_vocab()
    return max((len(token.encode()) for token in vocab), default=1) or 1


def _splits_cleanly(tokenizer: Tokenizer) -> bool:
    for text in _PROBES:
        whole = tokenizer.encode(text, add_special_tokens=False)
        for point in _BOUNDARY.finditer(text):
            left, right = text[: point.start()], text[point.start() :]
            if (
                tokenizer.encode(left, add_special_tokens=False) + tokenizer.encode(right, add_special_tokens=False)
                != whole
            ):
                return False
    return True


def _special_prefix(tokenizer: Tokenizer) -> tuple[int, ...] | None:
    text = _PROBES[0]
    bare, full = tokenizer.encode(text, add_special_tokens=False), tokenizer.encode(text, add_special_tokens=True)
    cut = len(full) - len(bare)
    return tuple(full[:cut]) if cut >= 0 and full[cut:] == bare else None
