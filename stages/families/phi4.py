"""Phi-4-mini: `<|tool_call|>[{"name": …, "arguments": …}, …]<|/tool_call|>`, `<think>` reasoning."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, any_of, call_object, json_calls, lark_json

START, END = "<|tool_call|>", "<|/tool_call|>"


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    return json_calls(body.strip())


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    schema = {"type": "array", "items": any_of([call_object(tool) for tool in tools]), "minItems": 1, "maxItems": 1}
    return f"start: {marker(START)} {lark_json(schema)} {marker(END)}"


FAMILY = Family(
    name="phi4",
    parse=parse,
    forced=forced,
    example=f'{START}[{{"name": <function-name>, "arguments": <args-json-object>}}]{END}',
    think=("<think>", "</think>"),
    calls=((START, END),),
)
