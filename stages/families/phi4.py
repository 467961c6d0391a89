"""Phi-4-mini: `<|tool_call|>[{"name": …, "arguments": …}, …]<|/tool_call|>`, `<think>` reasoning
(Phi-4-reasoning). Phi-4-mini also writes its call list as plain text, `functools[{…}, …]`, the
form vLLM's and SGLang's Phi-4-mini parsers read; that form is the whole answer."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_calls, lark_call_list
from stages.families.progress import CallProgress, call_list

START, END = "<|tool_call|>", "<|/tool_call|>"
FUNCTOOLS = "functools["


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    return json_calls(("[" if opener == FUNCTOOLS else "") + body.strip())


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    return call_list(("[" if opener == FUNCTOOLS else "") + body)


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return f"start: {marker(START)} {lark_call_list(tools)} {marker(END)}"


FAMILY = Family(
    name="phi4",
    parse=parse,
    forced=forced,
    example=f'{START}[{{"name": <function-name>, "arguments": <args-json-object>}}]{END}',
    think=("<think>", "</think>"),
    calls=((START, END),),
    trigger=START,
    leading=(FUNCTOOLS,),
    progress=progress,
)
