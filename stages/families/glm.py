"""GLM-4.5 / 4.6 / 4.7: `<tool_call>name\\n<arg_key>key</arg_key>\\n<arg_value>value</arg_value>\\n…</tool_call>`,
each value text read as its schema's type (`xml_params.py`); a key the schema does not declare is read as JSON
where it parses, as GLM's own parser does."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall
from stages.families.progress import CallProgress
from stages.families.xml_params import XmlMarkup, forced_calls, parse_call, read_call

START, END = "<tool_call>", "</tool_call>"
MARKUP = XmlMarkup(
    name_open="",
    name_end="\n",
    key_open="<arg_key>",
    key_end="</arg_key>",
    value_open="<arg_value>",
    value_end="</arg_value>",
    call_end="",
    key_gap="\n",
    undeclared_text=False,
)


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    return parse_call(MARKUP, body, tools)


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    call, _ = read_call(MARKUP, body, tools)
    return [] if call is None else [call]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return forced_calls(MARKUP, tools, marker, START, END)


FAMILY = Family(
    name="glm",
    parse=parse,
    forced=forced,
    example=f"{START}<function-name>\n<arg_key><key></arg_key>\n<arg_value><value></arg_value>\n{END}",
    think=("<think>", "</think>"),
    calls=((START, END),),
    json_bodies=False,
    trigger=START,
    progress=progress,
)
