"""The families mlx-lm already knows (Qwen, GLM, Kimi, Gemma, MiniMax, …):
its inferred markers and tool parser, adapted to a `Family`."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from pipeline.requests import Tool
from stages.families import glm, hermes, kimi, minimax, qwen3_coder
from stages.families.base import Family, MarkerRef, ParsedCall, named_call
from stages.families.preamble import template_tool
from stages.families.progress import one_object
from stages.models.loading import Tokenizer
from stages.models.mlx_internals import is_json_tool_parser, tool_parser_kind

# mlx-lm's parsers whose markup has a family here (its parser, the grammar of a forced call, its progress).
OWN_FAMILIES = {
    "qwen3_coder": qwen3_coder.FAMILY,
    "glm47": glm.FAMILY,
    "minimax_m2": minimax.FAMILY,
    "kimi_k2": kimi.FAMILY,
}


def family_of(tokenizer: Tokenizer) -> Family | None:
    """mlx-lm's parser for the model as a family; None where it inferred none."""
    start, end, parser = tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser
    if not start or not end or parser is None:
        return None
    kind = tool_parser_kind(parser)
    if kind in OWN_FAMILIES:
        return OWN_FAMILIES[kind]
    json_markup = is_json_tool_parser(parser)

    def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
        schema = [template_tool(tool) for tool in tools]
        try:
            parsed: Any = parser(body, schema)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = [named_call(item) for item in items]
        if not calls or any(call is None for call in calls):
            return None
        return [call for call in calls if call is not None]

    def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
        return (
            hermes.forced(tools, marker)
            .replace(marker(hermes.START), marker(start))
            .replace(marker(hermes.END), marker(end))
        )

    think = (tokenizer.think_start, tokenizer.think_end) if tokenizer.think_start and tokenizer.think_end else None
    return Family(
        name="mlx-lm",
        parse=parse,
        forced=forced if json_markup else partial(_unsupported, kind),
        example=f'{start}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{end}',
        think=think,
        calls=((start, end),),
        trigger=start if json_markup else None,
        progress=one_object if json_markup else None,
    )


def _unsupported(kind: str, tools: Sequence[Tool], marker: MarkerRef) -> str:
    raise NotImplementedError(
        f"mlx-lm reads this model's calls with its {kind!r} parser, whose markup has no grammar here"
    )
