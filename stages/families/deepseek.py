"""DeepSeek V3 / V3.1 / R1: `<｜tool▁calls▁begin｜>` then per call
`<｜tool▁call▁begin｜>name<｜tool▁sep｜>{…}<｜tool▁call▁end｜>` (V3.1) or
`…begin｜>function<｜tool▁sep｜>name\\n```json\\n{…}\\n```…end｜>` (V3, R1);
`<think>` reasoning. The DSML calls of V3.2 and later (`deepseek_dsml.py`) are read too,
for a DeepSeek model whose template does not say which markup it writes."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families import deepseek_dsml
from stages.families.base import Family, MarkerRef, ParsedCall, json_object, lark_arguments, lark_text
from stages.families.progress import CallProgress, named_arguments

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE_OPEN = re.compile(r"\s*```(?:json)?\s*")
_FENCED = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
# The token every DSML tag holds, among the markers this family reads.
DSML = deepseek_dsml.DSML
_DSML_OPENERS = frozenset(opener for opener, _ in deepseek_dsml.CALLS)


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    if opener in _DSML_OPENERS:
        return deepseek_dsml.parse(opener, body, tools)
    call = _parse_sep(body)
    return None if call is None else [call]


def _parse_sep(body: str) -> ParsedCall | None:
    head, sep, rest = body.partition(SEP)
    if not sep:
        return None
    if head.strip() == "function":
        name, _, rest = rest.partition("\n")
        fenced = _FENCED.match(rest)
        rest = fenced.group(1) if fenced else rest
    else:
        name = head
    arguments = json_object(rest.strip())
    return None if arguments is None or not name.strip() else (name.strip(), arguments)


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    """The sep forms as they are written (DSML's as `deepseek_dsml.py` reads it)."""
    if opener in _DSML_OPENERS:
        return deepseek_dsml.progress(opener, body, tools)
    head, sep, rest = body.partition(SEP)
    if not sep:
        return []
    if head.strip() != "function":
        return named_arguments(head, body, len(head) + len(sep))
    name, newline, fenced = rest.partition("\n")
    brace = fenced.find("{")
    if not newline or brace < 0 or not _FENCE_OPEN.fullmatch(fenced[:brace]):
        return []
    return named_arguments(name, body, len(body) - len(fenced) + brace)


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    rules = [
        f"c{i}: {marker(CALL_BEGIN)} {lark_text(tool.name)} {marker(SEP)} {lark_arguments(tool)} {marker(CALL_END)}"
        for i, tool in enumerate(tools)
    ]
    choice = " | ".join(f"c{i}" for i in range(len(tools)))
    return f"start: {marker(CALLS_BEGIN)} ({choice}) {marker(CALLS_END)}\n" + "\n".join(rules)


FAMILY = Family(
    name="deepseek",
    parse=parse,
    forced=forced,
    example=f"{CALLS_BEGIN}{CALL_BEGIN}<function-name>{SEP}<args-json-object>{CALL_END}{CALLS_END}",
    think=("<think>", "</think>"),
    calls=((CALL_BEGIN, CALL_END), *deepseek_dsml.CALLS),
    json_bodies=False,
    trigger=CALLS_BEGIN,
    progress=progress,
    dropped=(CALLS_BEGIN, CALLS_END, *deepseek_dsml.BLOCKS),
)
