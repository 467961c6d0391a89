"""Calls stream in every family: fed as the model writes it, a forced call in
the family's own markup starts once its name is whole and its arguments
arrive in pieces that join to the finished call's; cut off by max tokens
inside its arguments it is still a call, with the arguments so far, and
no markup leaks as text. The JSON reader under it is checked on its own."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.events import CompletionEvent, TextDelta, ToolCall, ToolCallDelta, ToolCallStart
from pipeline.requests import Tool
from stages.families import FAMILIES
from stages.families.base import Family
from stages.families.jsonscan import scan_value
from stages.reply.markup import markers_for, splitter_for
from tests.families import CASES, FamilyCase

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = (Tool(name="get_weather", parameters=CITY), Tool(name="get_time"))


def family_of(case: FamilyCase) -> Family:
    return FAMILIES[case.name]


def feed(family: Family, pieces: list[str], *, cut: bool = False) -> list[list[CompletionEvent]]:
    splitter = splitter_for(family, markers_for(family, TOOLS, parse_tools=True, forced=True))
    steps = [splitter.feed(piece) for piece in pieces]
    return [*steps, splitter.feed("", final=True, cut=cut)]


def joined(events: list[CompletionEvent]) -> tuple[ToolCall, str]:
    (call,) = [e for e in events if isinstance(e, ToolCall)]
    return call, "".join(e.arguments for e in events if isinstance(e, ToolCallDelta) and e.index == call.index)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_forced_call_streams_as_written(case: FamilyCase) -> None:
    steps = feed(family_of(case), list(case.forced_text))
    events = [event for step in steps for event in step]
    call, pieces = joined(events)
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert pieces == call.arguments
    first_start = next(i for i, step in enumerate(steps) if any(isinstance(e, ToolCallStart) for e in step))
    # Started while the arguments were still being written, and sent a piece at a time.
    assert first_start < case.forced_text.index("Paris")
    assert sum(isinstance(e, ToolCallDelta) for e in events) >= len("Paris")
    assert not any(isinstance(e, TextDelta) for e in events)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_call_cut_inside_its_arguments_is_a_call(case: FamilyCase) -> None:
    written = case.forced_text[: case.forced_text.index("Paris") + 3]
    events = [event for step in feed(family_of(case), [written], cut=True) for event in step]
    call, pieces = joined(events)
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Par')
    assert pieces == call.arguments
    assert not any(isinstance(e, TextDelta) for e in events), events


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(value=JSON, indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans())
def test_scanned_prefixes_grow_into_the_whole_value(value: object, indent: int | None, ascii_only: bool) -> None:
    written = json.dumps({"v": value}, indent=indent, ensure_ascii=ascii_only)
    whole = scan_value(written + " tail")
    assert whole.end == len(written) and not whole.broken
    assert json.loads(whole.text) == json.loads(written)
    if not ascii_only:
        assert whole.text == json.dumps({"v": value}, ensure_ascii=False)
    shown = ""
    for end in range(len(written) + 1):
        prefix = scan_value(written[:end]).text
        assert prefix.startswith(shown) and whole.text.startswith(prefix), (written[:end], prefix)
        shown = prefix
