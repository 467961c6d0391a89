"""Model families' tool-call and reasoning markup, chosen per model.

`choose_family` reads the model's vocabulary and chat template once at
start and returns the `Family` whose markup the model writes: gpt-oss's
harmony channels, DeepSeek, Mistral, Phi-4, Llama 3 JSON, Hermes/Qwen
`<tool_call>`, the families whose calls mlx-lm recognises (Qwen3-Coder, GLM,
MiniMax-M2, Kimi K2: their own modules), whatever else mlx-lm infers, or plain JSON for a
model with no call markup at all. `MLX_RELAY_TOOL_PARSER` and
`MLX_RELAY_REASONING_PARSER` override the choice for a model whose
template is unusual.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from stages.families import (
    deepseek,
    glm,
    harmony,
    hermes,
    kimi,
    llama3,
    minimax,
    mistral,
    mlxlm,
    phi4,
    plain,
    qwen3_coder,
)
from stages.families.base import Family
from stages.models.loading import Tokenizer

FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        "harmony": harmony.FAMILY,
        "deepseek": deepseek.FAMILY,
        "mistral": mistral.FAMILY,
        "phi4": phi4.FAMILY,
        "hermes": hermes.FAMILY,
        "llama3": llama3.FAMILY,
        "json": plain.FAMILY,
        "qwen3_coder": qwen3_coder.FAMILY,
        "glm": glm.FAMILY,
        "minimax": minimax.FAMILY,
        "kimi": kimi.FAMILY,
    }
)
THINK_MARKERS: Mapping[str, tuple[str, str] | None] = MappingProxyType(
    {
        "none": None,
        "think": ("<think>", "</think>"),
        "mistral": ("[THINK]", "[/THINK]"),
        "harmony": harmony.FAMILY.think,
    }
)
# The names MLX_RELAY_TOOL_PARSER takes: the families, and mlx-lm's own inference.
TOOL_PARSERS = (*FAMILIES, "mlx-lm")


def choose_family(
    tokenizer: Tokenizer, *, tool_parser: str | None = None, reasoning_parser: str | None = None
) -> Family:
    """The markup `tokenizer`'s model writes.

    Raises:
        ValueError: `tool_parser` is "mlx-lm" and mlx-lm inferred no parser for the model.
    """
    vocab = _vocab(tokenizer)
    template = _template(tokenizer)
    if tool_parser == "mlx-lm":
        family = mlxlm.family_of(tokenizer)
        if family is None:
            raise ValueError("mlx-lm infers no tool parser for this model")
    elif tool_parser is not None:
        family = FAMILIES[tool_parser]
    else:
        family = _detect(tokenizer, vocab, template)
    if reasoning_parser is not None:
        return attrs.evolve(family, think=THINK_MARKERS[reasoning_parser])
    return attrs.evolve(family, think=_think(tokenizer, family, vocab, template))


def _detect(tokenizer: Tokenizer, vocab: Mapping[str, int], template: str) -> Family:
    if harmony.CHANNEL in vocab and harmony.CONSTRAIN in vocab:
        return harmony.FAMILY
    if deepseek.CALL_BEGIN in vocab or deepseek.CALL_BEGIN in template:
        return deepseek.FAMILY
    if mistral.START in vocab:
        return mistral.COMPACT if mistral.ARGS in vocab else mistral.FAMILY
    if phi4.START in vocab:
        return phi4.FAMILY
    if llama3.PYTHON_TAG in vocab and "<|start_header_id|>" in template:
        return llama3.FAMILY
    inferred = mlxlm.family_of(tokenizer)
    if inferred is not None:
        return inferred
    if hermes.START in vocab and hermes.END in vocab:
        return hermes.FAMILY
    if llama3.PYTHON_TAG in vocab:
        return llama3.FAMILY
    return plain.FAMILY


def _think(tokenizer: Tokenizer, family: Family, vocab: Mapping[str, int], template: str) -> tuple[str, str] | None:
    """The family's think markers where the model has them, else what mlx-lm inferred."""
    if family.think is not None and all(marker in vocab or marker in template for marker in family.think):
        return family.think
    if tokenizer.think_start and tokenizer.think_end:
        return tokenizer.think_start, tokenizer.think_end
    return None


def _vocab(tokenizer: Tokenizer) -> Mapping[str, int]:
    get_vocab: Any = getattr(tokenizer, "get_vocab", None)
    return get_vocab() if callable(get_vocab) else {}


def _template(tokenizer: Tokenizer) -> str:
    template: Any = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else ""
