"""Llama 3.1 / 3.2: `{"name": …, "parameters": …}` as the whole answer, bare or
after `<|python_tag|>`; several calls may be joined by `;`."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.requests import Tool
from stages.families.base import Family, MarkerRef, ParsedCall, json_calls, lark_calls
from stages.families.progress import CallProgress, separated_calls

PYTHON_TAG = "<|python_tag|>"


def parse(opener: str, body: str, tools: Sequence[Tool]) -> list[ParsedCall] | None:
    text = (opener if opener == "{" else "") + body
    calls: list[ParsedCall] = []
    for part in _split_calls(text.strip()):
        parsed = json_calls(part)
        if parsed is None:
            return None
        calls.extend(parsed)
    return calls or None


def progress(opener: str, body: str, tools: Sequence[Tool]) -> list[CallProgress]:
    return separated_calls((opener if opener == "{" else "") + body)


def _split_calls(text: str) -> list[str]:
    """`{…}; {…}`: vLLM's separator for parallel calls, outside JSON strings."""
    parts: list[str] = []
    depth, in_string, escaped, start = 0, False, False, 0
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == ";" and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def forced(tools: Sequence[Tool], marker: MarkerRef) -> str:
    return f"start: {lark_calls(tools, arguments_key='parameters')}"


FAMILY = Family(
    name="llama3",
    parse=parse,
    forced=forced,
    example='{"name": <function-name>, "parameters": <args-json-object>}',
    calls=((PYTHON_TAG, None),),
    leading=("{",),
    trigger=PYTHON_TAG,
    progress=progress,
)
