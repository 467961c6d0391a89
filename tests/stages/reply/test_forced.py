"""stages/reply/forced.py: a forced call cut off by max tokens before its name is still that call.

Every family with a forced grammar (tests/families.py) writes its forced call; the output is cut at
every character of it, fed whole and a character at a time, and must end in one call of the forced
tool: with arguments "" where the cut lands before or inside the name, and never with the markup as
text. Through the sink, the tiny model's real tokens are cut as max tokens cuts them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest

from pipeline.events import CompletionEvent, FinishReason, Summary, TextDelta, ToolCall, ToolCallDelta, ToolCallStart
from pipeline.requests import ChatRequest, Tool, ToolChoice, ToolChoiceMode
from stages.families import FAMILIES
from stages.families.base import Splitter
from stages.models.loading import Tokenizer
from stages.reply.forced import ForcedCall
from stages.reply.markup import markers_for, splitter_for
from tests.families import CASES, FamilyCase
from tests.stages.reply.test_sink import Row, drive, events_of, row, single_row_outputs, steps_for

NAME = "get_weather"
WEATHER = Tool(name=NAME, parameters={"type": "object", "properties": {"city": {"type": "string"}}})
OTHER = Tool(name="get_time", parameters={"type": "object"})
FAMILY_CASES = [pytest.param(case, id=case.name) for case in CASES]


def forced_splitter(family_name: str) -> Splitter:
    """The splitter the sink builds for a call forced to `get_weather` in this family's markup."""
    family = FAMILIES[family_name]
    markers = markers_for(family, [WEATHER], parse_tools=True, forced=True)
    return ForcedCall(inner=splitter_for(family, markers), name=NAME)


def cut_whole(family_name: str, text: str) -> list[CompletionEvent]:
    return forced_splitter(family_name).feed(text, final=True, cut=True)


def cut_streamed(family_name: str, text: str) -> list[CompletionEvent]:
    splitter = forced_splitter(family_name)
    events = [event for char in text for event in splitter.feed(char)]
    return events + splitter.feed("", final=True, cut=True)


def the_call(events: Sequence[CompletionEvent]) -> tuple[str, str]:
    """The one call in `events` (name, arguments); a streamed start and pieces must agree with its end."""
    (call,) = [event for event in events if isinstance(event, ToolCall)]
    assert call.index == 0 and call.id.startswith("call_")
    starts = [event for event in events if isinstance(event, ToolCallStart)]
    assert all((start.index, start.id, start.name) == (0, call.id, call.name) for start in starts)
    if starts:
        pieces = "".join(event.arguments for event in events if isinstance(event, ToolCallDelta))
        assert pieces == call.arguments
    return call.name, call.arguments


def name_end(case_text: str) -> int:
    return case_text.index(NAME) + len(NAME)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_cut_before_or_inside_the_name_is_the_forced_call(case: FamilyCase) -> None:
    text = case.forced_text
    family_name = case.tool_parser or case.name
    for end in range(name_end(text) + 1):
        for events in (cut_whole(family_name, text[:end]), cut_streamed(family_name, text[:end])):
            assert the_call(events) == (NAME, ""), (end, text[:end], events)
            assert not [event for event in events if isinstance(event, TextDelta)], (end, text[:end], events)


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_every_cut_is_one_call_of_the_forced_tool(case: FamilyCase) -> None:
    text = case.forced_text
    family_name = case.tool_parser or case.name
    for end in range(len(text)):
        whole, streamed = cut_whole(family_name, text[:end]), cut_streamed(family_name, text[:end])
        assert the_call(whole)[0] == the_call(streamed)[0] == NAME, (end, text[:end])


@pytest.mark.parametrize("case", FAMILY_CASES)
def test_a_whole_call_is_left_to_the_family(case: FamilyCase) -> None:
    text = case.forced_text
    family_name = case.tool_parser or case.name
    splitter = forced_splitter(family_name)
    events = splitter.feed(text, final=True)
    assert the_call(events)[0] == NAME and splitter.tool_calls == 1
    assert the_call(events)[1] != ""


def test_only_a_cut_ends_with_the_forced_call() -> None:
    # Output the model ended (EOS, a stop string) inside the markup is the family's to judge.
    splitter = forced_splitter("hermes")
    assert splitter.feed("<tool_call>\n{", final=True) == []
    assert splitter.tool_calls == 0


@pytest.mark.parametrize(
    ("choice", "tools", "forced"),
    [
        pytest.param(ToolChoice(mode=ToolChoiceMode.NAMED, name=NAME), (OTHER, WEATHER), NAME, id="named"),
        pytest.param(ToolChoice(mode=ToolChoiceMode.REQUIRED), (WEATHER,), NAME, id="required-one-tool"),
        pytest.param(ToolChoice(mode=ToolChoiceMode.REQUIRED), (WEATHER, OTHER), None, id="required-several"),
        pytest.param(ToolChoice(), (WEATHER,), None, id="auto"),
        pytest.param(ToolChoice(mode=ToolChoiceMode.NONE), (WEATHER,), None, id="none"),
    ],
)
def test_forced_tool(choice: ToolChoice, tools: tuple[Tool, ...], forced: str | None) -> None:
    request = ChatRequest(messages=(), params=row("r").admitted.prepared.params, tools=tools, tool_choice=choice)
    assert request.forced_tool == forced


def forced_row(choice: ToolChoice, tools: tuple[Tool, ...]) -> Row:
    """A chat row whose request forces `choice` among `tools` (the sink reads the request the row carries)."""
    target = row("forced", chat=True)
    prepared = target.admitted.prepared
    assert isinstance(prepared.request, ChatRequest)
    request = attrs.evolve(prepared.request, tools=tools, tool_choice=choice)
    admitted = attrs.evolve(target.admitted, prepared=attrs.evolve(prepared, request=request))
    return Row(target.request_id, target.reply, admitted)


async def cut_through_sink(
    tokenizer: Tokenizer, target: Row, tokens: Sequence[int], per_step: int
) -> tuple[list[CompletionEvent], Summary]:
    """The reply's events and summary where max tokens ends the row after `tokens`."""
    deltas = steps_for(target.request_id, tokens, per_step, FinishReason.LENGTH)
    await drive(tokenizer, single_row_outputs(target, deltas))
    return await events_of(target.reply), target.reply.summary


def tiny_forced_prefixes(tokenizer: Tokenizer) -> list[list[int]]:
    """The tiny model's forced call (Hermes markup) as tokens, cut after each token up to its name's."""
    head = tokenizer.encode('<tool_call>\n{"name": "get_weather', add_special_tokens=False)
    return [head[:end] for end in range(1, len(head) + 1)]


@pytest.mark.parametrize("per_step", [1, 3])
@pytest.mark.parametrize(
    ("choice", "tools"),
    [
        pytest.param(ToolChoice(mode=ToolChoiceMode.NAMED, name=NAME), (OTHER, WEATHER), id="named"),
        pytest.param(ToolChoice(mode=ToolChoiceMode.REQUIRED), (WEATHER,), id="required-one-tool"),
    ],
)
async def test_sink_ends_a_cut_forced_reply_with_the_call(
    tokenizer: Tokenizer, choice: ToolChoice, tools: tuple[Tool, ...], per_step: int
) -> None:
    for tokens in tiny_forced_prefixes(tokenizer):
        events, summary = await cut_through_sink(tokenizer, forced_row(choice, tools), tokens, per_step)
        assert the_call(events) == (NAME, ""), tokenizer.decode(tokens)
        assert not [event for event in events if isinstance(event, TextDelta)]
        assert summary.finish_reason is FinishReason.LENGTH
        assert summary.usage.completion_tokens == len(tokens)


async def test_sink_leaves_required_among_several_tools_as_is(tokenizer: Tokenizer) -> None:
    choice = ToolChoice(mode=ToolChoiceMode.REQUIRED)
    (tokens,) = tiny_forced_prefixes(tokenizer)[:1]
    events, summary = await cut_through_sink(tokenizer, forced_row(choice, (WEATHER, OTHER)), tokens, 1)
    assert events == [] and summary.finish_reason is FinishReason.LENGTH
