"""gpt-oss (OpenAI harmony): the `analysis` channel is reasoning, a
`commentary` message to `functions.x` is a call, `final` is the answer.

The recipient stands in the channel (`<|channel|>commentary to=functions.x`)
or in the role header (`<|start|>assistant to=functions.x<|channel|>…`);
the arguments follow `<|message|>`, and `<|call|>` (an EOS) ends the call.
Message headers and `<|end|>` are layout and are removed."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, any_of, arguments_schema, json_object, lark_json, lark_text

CHANNEL, MESSAGE, START, END = "<|channel|>", "<|message|>", "<|start|>", "<|end|>"
CONSTRAIN = "<|constrain|>"
_RECIPIENT = re.compile(r"^\s*(?:functions\.)?([^\s<]+)")


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    header, sep, arguments = body.partition(MESSAGE)
    named = _RECIPIENT.match(header)
    if not sep or named is None:
        return None
    parsed = json_object(arguments.strip())
    return None if parsed is None else [(named.group(1), parsed)]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    rules = [
        f"c{i}: {marker(CHANNEL)} {lark_text('commentary to=functions.' + tool.name + ' ')} {marker(CONSTRAIN)} "
        f"{lark_text('json')} {marker(MESSAGE)} {lark_json(arguments_schema(tool))}"
        for i, tool in enumerate(tools)
    ]
    return "start: " + " | ".join(f"c{i}" for i in range(len(tools))) + "\n" + "\n".join(rules)


FAMILY = Family(
    name="harmony",
    parse=parse,
    forced=forced,
    example=f"{CHANNEL}commentary to=functions.<function-name> {CONSTRAIN}json{MESSAGE}<args-json-object>",
    think=(f"{CHANNEL}analysis{MESSAGE}", END),
    calls=((f"{CHANNEL}commentary to=", None),),
    leading=("to=",),
    dropped=(f"{START}assistant", f"{CHANNEL}final{MESSAGE}", f"{CHANNEL}commentary{MESSAGE}", END),
)
