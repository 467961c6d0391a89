"""Hermes / Qwen: `<tool_call>{"name": …, "arguments": …}</tool_call>`, `<think>` reasoning."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_calls, lark_calls
from stages.families.progress import one_object

START, END = "<tool_call>", "</tool_call>"


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    calls = json_calls(body.strip())
    return calls if calls is not None and len(calls) == 1 else None


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return f'start: {marker(START)} "\\n" {lark_calls(tools)} "\\n" {marker(END)}'


FAMILY = Family(
    name="hermes",
    parse=parse,
    forced=forced,
    example=f'{START}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{END}',
    think=("<think>", "</think>"),
    calls=((START, END),),
    trigger=START,
    progress=one_object,
)
