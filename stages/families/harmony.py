"""gpt-oss (OpenAI harmony): the output is a run of messages; `analysis`
is reasoning, a message to `functions.x` is a call, `final` (and a
`commentary` preamble) is the answer (`harmony_stream.py` reads them).

A forced call is one commentary message to the function, its JSON
constrained; `<|call|>` (an EOS) ends it."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.events import ToolCall
from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_object, lark_arguments, lark_text
from stages.families.harmony_stream import CHANNEL, CONSTRAIN, END, MESSAGE, START, HarmonySplitter

__all__ = ["CHANNEL", "CONSTRAIN", "END", "FAMILY", "MESSAGE", "START"]


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    """The calls in a whole harmony output (the splitter is what reads a stream)."""
    events = HarmonySplitter(tools=tuple(tools), parse_calls=True).feed(opener + body, final=True)
    calls = [(event.name, json_object(event.arguments)) for event in events if isinstance(event, ToolCall)]
    return [(name, arguments) for name, arguments in calls if arguments is not None] or None


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    rules = [
        f"c{i}: {marker(CHANNEL)} {lark_text('commentary to=functions.' + tool.name + ' ')} {marker(CONSTRAIN)} "
        f"{lark_text('json')} {marker(MESSAGE)} {lark_arguments(tool)}"
        for i, tool in enumerate(tools)
    ]
    return "start: " + " | ".join(f"c{i}" for i in range(len(tools))) + "\n" + "\n".join(rules)


FAMILY = Family(
    name="harmony",
    parse=parse,
    forced=forced,
    example=f"{CHANNEL}commentary to=functions.<function-name> {CONSTRAIN}json{MESSAGE}<args-json-object>",
    think=(f"{CHANNEL}analysis{MESSAGE}", END),
    splitter=lambda tools, parse_calls: HarmonySplitter(tools=tools, parse_calls=parse_calls),
)
