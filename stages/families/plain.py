"""A model with no tool-call markup: a forced call is the whole output, as
JSON (`{"name", "arguments"}`, a list of them for `required`), as vLLM
does; `auto` answers in text, so calls are parsed only when forced."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_calls, lark_call_list, lark_calls
from stages.families.progress import object_or_list


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    return json_calls(opener + body)


def forced_named(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return f"start: {lark_calls(tools)}"


def forced_list(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return f"start: {lark_call_list(tools, most=None)}"


FAMILY = Family(
    name="json",
    parse=parse,
    forced=forced_named,
    example='{"name": <function-name>, "arguments": <args-json-object>}',
    leading=("{", "["),
    auto_calls=False,
    forced_required=forced_list,
    progress=object_or_list,
)
