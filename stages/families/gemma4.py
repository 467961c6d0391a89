"""Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>` per call, its arguments in Gemma's
object notation (`gemma4_notation.py`, read into JSON as they stream; `gemma4_grammar.py` writes them
from the tool's schema for a forced call), and reasoning in the thought channel,
`<|channel>thought\\n…<channel|>`. The template's thinking-off prompt ends in an empty channel
(`<|channel>thought\\n<channel|>`), so it opens no reasoning; with `enable_thinking` the model opens
the channel itself.

A call sits inside the text as written: the whitespace beside it is the model's text, not layout
(`Family.inline_calls`), and an end marker inside one of its strings is text (`Family.closer_inside`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_object
from stages.families.gemma4_grammar import forced_calls
from stages.families.gemma4_notation import QUOTE, in_string, scan_notation
from stages.families.jsonscan import Scan
from stages.families.progress import CallProgress

START, END = "<|tool_call>", "<tool_call|>"
THINK = ("<|channel>thought", "<channel|>")
_CALL = "call:"
# A tool's name as a call writes it (`get-weather`, `weather.get`): up to the arguments' `{`.
_NAME = re.compile(r"[^\s{}\[\]<>,\"]+")


def _read(body: str) -> tuple[str, Scan] | None:
    """The call's name and its arguments as far as they are written; None until the name is whole,
    or where the body is no call."""
    at = len(body) - len(body.lstrip())
    brace = body.find("{", at)
    if not body.startswith(_CALL, at) or brace < 0:
        return None
    name = body[at + len(_CALL) : brace].strip()
    if not _NAME.fullmatch(name):
        return None
    return name, scan_notation(body, brace)


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    read = _read(body)
    if read is None or read[1].end is None or body[read[1].end :].strip():
        return None
    arguments = json_object(read[1].text)
    return None if arguments is None else [(read[0], arguments)]


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    read = _read(body)
    return [] if read is None else [CallProgress(read[0], read[1].text)]


def _in_string(opener: str, body: str) -> bool:
    return in_string(body)


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return forced_calls(tools, marker, START, END)


FAMILY = Family(
    name="gemma4",
    parse=parse,
    forced=forced,
    example=f"{START}{_CALL}<function-name>{{<key>:{QUOTE}<string value>{QUOTE},<key>:<number>}}{END}",
    think=THINK,
    calls=((START, END),),
    json_bodies=False,
    closer_inside=_in_string,
    inline_calls=True,
    trigger=START,
    progress=progress,
)
