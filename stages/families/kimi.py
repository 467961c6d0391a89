"""Kimi K2: `<|tool_calls_section_begin|>` then per call
`<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{…}<|tool_call_end|>`, then
`<|tool_calls_section_end|>`; the arguments are JSON."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_object, lark_arguments, lark_text
from stages.families.progress import CallProgress, named_arguments

START, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_CALL_ID = re.compile(r"^\s*(?:functions\.)?(.+?):\d+\s*$", re.DOTALL)


def _calls(body: str) -> list[tuple[str, str, int]]:
    """(name, body, where its arguments start) for each call begun in `body`."""
    found = []
    for part in body.split(CALL_BEGIN)[1:]:
        head, sep, _ = part.partition(ARGUMENTS)
        named = _CALL_ID.match(head)
        if not sep or named is None:
            break
        found.append((named.group(1), part.split(CALL_END)[0], len(head) + len(sep)))
    return found


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    calls = [(name, json_object(part[start:].strip())) for name, part, start in _calls(body)]
    if not calls or body.count(CALL_BEGIN) != len(calls) or any(arguments is None for _, arguments in calls):
        return None
    return [(name, arguments) for name, arguments in calls if arguments is not None]


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    return [call for name, part, start in _calls(body) for call in named_arguments(name, part, start)]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    rules = [
        f"c{i}: {marker(CALL_BEGIN)} {lark_text(f'functions.{tool.name}:0')} {marker(ARGUMENTS)} "
        f"{lark_arguments(tool)} {marker(CALL_END)}"
        for i, tool in enumerate(tools)
    ]
    choice = " | ".join(f"c{i}" for i in range(len(tools)))
    return f"start: {marker(START)} ({choice}) {marker(END)}\n" + "\n".join(rules)


FAMILY = Family(
    name="kimi",
    parse=parse,
    forced=forced,
    example=f"{START}{CALL_BEGIN}functions.<function-name>:0{ARGUMENTS}<args-json-object>{CALL_END}{END}",
    think=("<think>", "</think>"),
    calls=((START, END),),
    json_bodies=False,
    trigger=START,
    progress=progress,
)
