"""Fill-in-the-middle: `/v1/completions` `suffix` for models trained on it.

A code model trained for infilling has three markers in its vocabulary;
the prompt is prefix-suffix-middle (PSM) text around them and the model
writes the middle. The format is read from the vocabulary once at start:
a model whose tokenizer has none of these triples cannot infill, and a
`suffix` for it is refused by name.

The markers, and the model's other repository markers (file separators,
padding), end the completion as EOS does: a model past its middle starts
another file (llama.cpp stops at them likewise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from pipeline.errors import RequestError, invalid
from pipeline.requests import GenerationParams, TextRequest
from stages.messages import PromptText
from stages.models.loading import Tokenizer


@attrs.frozen
class FimFormat:
    name: str
    prefix: str
    suffix: str
    middle: str
    # Further markers that end an infill where the vocabulary has them.
    ends: tuple[str, ...] = ()
    # CodeLlama's trained prompt spaces its markers: `<PRE> {prefix} <SUF>{suffix} <MID>`.
    spaced: bool = False

    def prompt(self, prefix: str, suffix: str) -> str:
        if self.spaced:
            return f"{self.prefix} {prefix} {self.suffix}{suffix} {self.middle}"
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


FORMATS = (
    # Qwen2.5-Coder, CodeGemma.
    FimFormat(
        "qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", ("<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")
    ),
    # StarCoder, StarCoder2.
    FimFormat(
        "starcoder",
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        ("<fim_pad>", "<file_sep>", "<reponame>", "<filename>"),
    ),
    FimFormat("santacoder", "<fim-prefix>", "<fim-suffix>", "<fim-middle>", ("<fim-pad>",)),
    FimFormat("codellama", "<PRE>", "<SUF>", "<MID>", ("<EOT>",), spaced=True),
    FimFormat("deepseek-coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)


@attrs.frozen
class Infill:
    """The model's infilling format and the token ids that end an infill."""

    format: FimFormat
    end_ids: tuple[int, ...]

    def request_prompt(self, request: TextRequest) -> tuple[PromptText, GenerationParams]:
        """The PSM prompt of a completion with a `suffix`, and its params with the infill's end tokens."""
        if not isinstance(request.prompt, str):
            raise invalid("'suffix' needs a text 'prompt', not token ids", param="suffix")
        assert request.suffix is not None
        params = request.params
        ends = tuple(dict.fromkeys((*params.stop_token_ids, *self.end_ids)))
        return PromptText(self.format.prompt(request.prompt, request.suffix), add_special_tokens=True), attrs.evolve(
            params, stop_token_ids=ends
        )


def find_infill(tokenizer: Tokenizer) -> Infill | None:
    """The first format whose three markers are each one token of the vocabulary; None if none is."""
    vocab = _vocab(tokenizer)
    for fim in FORMATS:
        markers = (fim.prefix, fim.suffix, fim.middle)
        if all(marker in vocab for marker in markers):
            ends = (*markers, *(end for end in fim.ends if end in vocab))
            return Infill(format=fim, end_ids=tuple(vocab[end] for end in ends))
    return None


def refuse_suffix() -> RequestError:
    return invalid(
        "'suffix' (fill-in-the-middle) needs a model whose tokenizer has fill-in-the-middle tokens; this one has none",
        param="suffix",
        code="unsupported_parameter",
    )


def _vocab(tokenizer: Tokenizer) -> Mapping[str, int]:
    get_vocab: Any = getattr(tokenizer, "get_vocab", None)
    vocab: Mapping[str, int] = get_vocab() if callable(get_vocab) else {}
    return vocab
