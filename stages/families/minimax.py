"""MiniMax-M2: `<minimax:tool_call>\\n<invoke name="name">\\n<parameter name="key">value</parameter>\\n…</invoke>\\n
</minimax:tool_call>`, each value text read as its schema's type (`xml_params.py`)."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall
from stages.families.progress import CallProgress
from stages.families.xml_params import XmlMarkup, forced_calls, parse_call, read_call

START, END = "<minimax:tool_call>", "</minimax:tool_call>"
MARKUP = XmlMarkup(
    name_open='<invoke name="',
    name_end='">',
    key_open='<parameter name="',
    key_end='">',
    value_open="",
    value_end="</parameter>",
    call_end="</invoke>",
    start_gap="\n",
    name_gap="\n",
    call_gap="\n",
)


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    return parse_call(MARKUP, body, tools)


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    call, _ = read_call(MARKUP, body, tools)
    return [] if call is None else [call]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return forced_calls(MARKUP, tools, marker, START, END)


FAMILY = Family(
    name="minimax",
    parse=parse,
    forced=forced,
    example=f'{START}\n<invoke name="<function-name>">\n<parameter name="<key>"><value></parameter>\n</invoke>\n{END}',
    think=("<think>", "</think>"),
    calls=((START, END),),
    json_bodies=False,
    trigger=START,
    progress=progress,
)
