"""Mistral: `[TOOL_CALLS] [{"name": …, "arguments": …}, …]` (v3–v7 tokenizers) or
`[TOOL_CALLS]name[ARGS]{…}` per call (v11+); `[THINK]…[/THINK]` reasoning, or, for a model
without those tokens whose template asks for it (Magistral Small 2506's system prompt),
`<think>…</think>` written as text. A call has no end marker: EOS or the next `[TOOL_CALLS]` ends it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from pipeline.requests import Tool
from stages.families.base import (
    Family,
    MarkerRef,
    ParsedCall,
    json_calls,
    json_object,
    lark_arguments,
    lark_call_list,
    lark_text,
)
from stages.families.progress import CallProgress, call_list, named_arguments

START, ARGS = "[TOOL_CALLS]", "[ARGS]"
THINK, THINK_TEXT = ("[THINK]", "[/THINK]"), ("<think>", "</think>")


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    text = body.strip()
    if text.startswith("["):
        return json_calls(text)
    name, sep, arguments = text.partition(ARGS)
    name = name.partition("[CALL_ID]")[0].strip()
    parsed = json_object(arguments.strip()) if sep else None
    if not name or parsed is None:
        return None
    return [(name, parsed)]


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    if body.lstrip().startswith("["):
        return call_list(body)
    name, sep, _ = body.partition(ARGS)
    return named_arguments(name.partition("[CALL_ID]")[0], body, len(name) + len(sep)) if sep else []


def forced_array(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return f"start: {marker(START)} {lark_call_list(tools)}"


def forced_compact(tools: Sequence[Tool], marker: MarkerRef) -> str:
    rules = [
        f"c{i}: {marker(START)} {lark_text(tool.name)} {marker(ARGS)} {lark_arguments(tool)}"
        for i, tool in enumerate(tools)
    ]
    return "start: " + " | ".join(f"c{i}" for i in range(len(tools))) + "\n" + "\n".join(rules)


FAMILY = Family(
    name="mistral",
    parse=parse,
    forced=forced_array,
    example=f'{START}[{{"name": <function-name>, "arguments": <args-json-object>}}]',
    think=THINK,
    calls=((START, None),),
    trigger=START,
    progress=progress,
)
COMPACT = Family(
    name="mistral",
    parse=parse,
    forced=forced_compact,
    example=f"{START}<function-name>{ARGS}<args-json-object>",
    think=THINK,
    calls=((START, None),),
    trigger=START,
    progress=progress,
)


def detect(vocab: Mapping[str, int], template: str) -> Family:
    """A Mistral model's markup: `[ARGS]` calls where its vocabulary has the token, else the JSON list;
    reasoning in `[THINK]` tokens, or in the `<think>` text its template asks for where it has none."""
    family = COMPACT if ARGS in vocab else FAMILY
    if THINK[0] not in vocab and THINK[0] not in template and all(marker in template for marker in THINK_TEXT):
        return attrs.evolve(family, think=THINK_TEXT)
    return family
