"""Qwen3-Coder: `<tool_call>\\n<function=name>\\n<parameter=key>\\nvalue\\n</parameter>\\n…`
`</function>\\n</tool_call>`, each value text read as its schema's type (`xml_params.py`)."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall
from stages.families.progress import CallProgress
from stages.families.xml_params import XmlMarkup, forced_calls, parse_call, read_call

START, END = "<tool_call>", "</tool_call>"
MARKUP = XmlMarkup(
    name_open="<function=",
    name_end=">",
    key_open="<parameter=",
    key_end=">",
    value_open="",
    value_end="</parameter>",
    call_end="</function>",
    start_gap="\n",
    name_gap="\n",
    call_gap="\n",
    pad="\n",
    trim_newline_only=True,
)


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    return parse_call(MARKUP, body, tools)


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    call, _ = read_call(MARKUP, body, tools)
    return [] if call is None else [call]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return forced_calls(MARKUP, tools, marker, START, END)


FAMILY = Family(
    name="qwen3_coder",
    parse=parse,
    forced=forced,
    example=f"{START}\n<function=<function-name>>\n<parameter=<key>>\n<value>\n</parameter>\n</function>\n{END}",
    think=("<think>", "</think>"),
    calls=((START, END),),
    json_bodies=False,
    trigger=START,
    progress=progress,
)
