"""Kimi K2 (K2-Instruct, K2-Thinking, K2.5, K2.6): `<|tool_calls_section_begin|>` then per call
`<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{…}<|tool_call_end|>`, then
`<|tool_calls_section_end|>`; the arguments are JSON, the tool's name is in the call's id (with or
without its `functions.` prefix). Kimi K3 writes another markup (`kimi_k3.py`).

A call is read left to right: its arguments end where their JSON value does, so a marker written
inside one of its strings is text. Pure; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_object, lark_arguments, lark_text
from stages.families.jsonscan import Scan, scan_value
from stages.families.progress import CallProgress

START, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_CALL_ID = re.compile(r"^\s*(?:functions\.)?(.+?):\d+\s*$", re.DOTALL)


@attrs.frozen
class _Call:
    """One call begun in a section: `arguments` as far as written, `closed` once its end marker follows."""

    name: str | None
    arguments: Scan | None = None
    start: int = 0
    closed: bool = False


def _calls(body: str) -> list[_Call]:
    """The calls begun in `body`, up to the first that is unfinished or broken (last, not closed)."""
    found: list[_Call] = []
    at = body.find(CALL_BEGIN)
    while at >= 0:
        head = at + len(CALL_BEGIN)
        arguments = body.find(ARGUMENTS, head)
        named = _CALL_ID.match(body[head:arguments]) if arguments >= 0 else None
        if named is None:
            return [*found, _Call(None)]
        start = arguments + len(ARGUMENTS)
        scan = scan_value(body, start)
        after = scan.end if scan.end is not None else len(body)
        closed = scan.end is not None and body[after:].lstrip().startswith(CALL_END)
        found.append(_Call(named.group(1).strip(), scan, start, closed))
        if not closed:
            return found
        at = body.find(CALL_BEGIN, body.index(CALL_END, after) + len(CALL_END))
    return found


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    """The section's calls, or None unless each is whole and its arguments a JSON object."""
    calls = _calls(body)
    parsed = [
        (call.name, json_object(body[call.start : call.arguments.end]))
        for call in calls
        if call.closed and call.name and call.arguments is not None and call.arguments.end is not None
    ]
    if not parsed or len(parsed) != len(calls) or any(arguments is None for _, arguments in parsed):
        return None
    return [(name, arguments) for name, arguments in parsed if arguments is not None]


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    return [
        CallProgress(call.name, call.arguments.text if call.arguments.text.startswith("{") else "")
        for call in _calls(body)
        if call.name and call.arguments is not None
    ]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    rules = [
        f"c{i}: {marker(CALL_BEGIN)} {lark_text(f'functions.{tool.name}:0')} {marker(ARGUMENTS)} "
        f"{lark_arguments(tool)} {marker(CALL_END)}"
        for i, tool in enumerate(tools)
    ]
    choice = " | ".join(f"c{i}" for i in range(len(tools)))
    return f"start: {marker(START)} ({choice}) {marker(END)}\n" + "\n".join(rules)


FAMILY = Family(
    name="kimi",
    parse=parse,
    forced=forced,
    example=f"{START}{CALL_BEGIN}functions.<function-name>:0{ARGUMENTS}<args-json-object>{CALL_END}{END}",
    think=("<think>", "</think>"),
    calls=((START, END),),
    # A section's end marker inside an argument's JSON string is text.
    json_bodies=True,
    trigger=START,
    progress=progress,
    # K2.5/K2.6 may open their calls without closing the think block the prompt opened.
    reasoning_openers=(START,),
    # The template writes a section right after the text: whitespace beside it is the model's.
    inline_calls=True,
)
