"""Model families' tool-call and reasoning markup, chosen per model.

`choose_family` reads the model's vocabulary and chat template once at
start and returns the `Family` whose markup the model writes: gpt-oss's
harmony channels, DeepSeek (V3.2 and later's DSML by their template), Mistral, Phi-4, Llama 3 JSON,
Llama 4's pythonic calls, Hermes/Qwen
`<tool_call>`, the families whose calls mlx-lm recognises (Qwen3-Coder, GLM,
MiniMax-M2, Kimi K2, Gemma 4: their own modules), Kimi K3's XTML (from its vocabulary, as mlx-lm
reads it), whatever else mlx-lm infers, or plain JSON for a
model with no call markup at all. `MLX_RELAY_TOOL_PARSER` and
`MLX_RELAY_REASONING_PARSER` override the choice for a model whose
template is unusual.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from stages.families import (
    deepseek,
    deepseek_dsml,
    gemma4,
    glm,
    harmony,
    hermes,
    kimi,
    kimi_k3,
    llama3,
    llama4,
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
        "deepseek_dsml": deepseek_dsml.FAMILY,
        "mistral": mistral.FAMILY,
        "phi4": phi4.FAMILY,
        "hermes": hermes.FAMILY,
        "llama3": llama3.FAMILY,
        "llama4": llama4.FAMILY,
        "json": plain.FAMILY,
        "qwen3_coder": qwen3_coder.FAMILY,
        "glm": glm.FAMILY,
        "minimax": minimax.FAMILY,
        "kimi": kimi.FAMILY,
        "kimi_k3": kimi_k3.FAMILY,
        "gemma4": gemma4.FAMILY,
    }
)
THINK_MARKERS: Mapping[str, tuple[str, str] | None] = MappingProxyType(
    {
        "none": None,
        "think": ("<think>", "</think>"),
        "mistral": ("[THINK]", "[/THINK]"),
        "harmony": harmony.FAMILY.think,
        "kimi_k3": kimi_k3.THINK,
        "gemma4": gemma4.THINK,
    }
)
# A control token written inside a marker.
_CONTROL_TOKEN = re.compile(r"<\|\w+\|>")
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
    if deepseek_dsml.DSML in template:
        # V3.2 and later keep V3's call tokens, but their template asks for DSML.
        return deepseek_dsml.detect(template)
    if deepseek.CALL_BEGIN in vocab or deepseek.CALL_BEGIN in template:
        return deepseek.FAMILY
    if mistral.START in vocab:
        return mistral.detect(vocab, template)
    if phi4.START in vocab:
        return phi4.FAMILY
    if all(token in vocab for token in kimi_k3.VOCABULARY):
        return kimi_k3.FAMILY
    if llama4.PYTHON_START in vocab and llama4.HEADER in template:
        return llama4.FAMILY
    if llama3.PYTHON_TAG in vocab and "<|start_header_id|>" in template:
        return llama3.FAMILY
    if all(marker in vocab or marker in template for marker in (gemma4.START, gemma4.END)):
        # Before mlx-lm's inference, which reads these calls (its `gemma4` parser) but cannot force or stream them.
        return gemma4.FAMILY
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
    if family.think is not None and all(_writes(marker, vocab, template) for marker in family.think):
        return family.think
    if tokenizer.think_start and tokenizer.think_end:
        return tokenizer.think_start, tokenizer.think_end
    return None


def _writes(marker: str, vocab: Mapping[str, int], template: str) -> bool:
    """The model writes `marker`: a token of it, in its template, or words between its control tokens (K3's
    `<|open|>think<|sep|>`)."""
    controls = _CONTROL_TOKEN.findall(marker)
    return marker in vocab or marker in template or (bool(controls) and all(token in vocab for token in controls))


def _vocab(tokenizer: Tokenizer) -> Mapping[str, int]:
    get_vocab: Any = getattr(tokenizer, "get_vocab", None)
    return get_vocab() if callable(get_vocab) else {}


def _template(tokenizer: Tokenizer) -> str:
    template: Any = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else ""
