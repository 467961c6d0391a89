"""Requests for model work that is not generation: embeddings, scores, tokenizing.

API-neutral like `pipeline/requests.py`: a `wire/` decoder builds one, the
stages read it. Text inputs are tokenized by the stages; token inputs come
as the client sent them (checked against the vocabulary there).
"""

from __future__ import annotations

import enum

import attrs

from pipeline.requests import ChatRequest

# An input is text, or token ids the client tokenized itself.
Input = str | tuple[int, ...]


class EncodingFormat(enum.Enum):
    FLOAT = "float"
    BASE64 = "base64"


@attrs.frozen(kw_only=True)
class EmbeddingRequest:
    model: str | None
    inputs: tuple[Input, ...]
    encoding_format: EncodingFormat = EncodingFormat.FLOAT
    dimensions: int | None = None


@attrs.frozen(kw_only=True)
class Embeddings:
    """One vector per input, in input order, as float32 values."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


@attrs.frozen(kw_only=True)
class ScoreRequest:
    """Pairs to judge: each `(query, document)` gets a relevance score in [0, 1]."""

    model: str | None
    pairs: tuple[tuple[str, str], ...]


@attrs.frozen(kw_only=True)
class Scores:
    scores: tuple[float, ...]
    prompt_tokens: int


@attrs.frozen(kw_only=True)
class TokenizeRequest:
    """Text to tokenize as given, or a chat rendered through the model's template first."""

    prompt: str | None = None
    chat: ChatRequest | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False
    # Whose tokenizer: a dedicated embedding model's when it is named, else the chat model's.
    model: str | None = None


@attrs.frozen(kw_only=True)
class DetokenizeRequest:
    tokens: tuple[int, ...]
    model: str | None = None
