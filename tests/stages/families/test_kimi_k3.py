"""Kimi K3's XTML family on a tokenizer with K3's control tokens.

K3 renders its prompts in Python (mlx-vlm's `encoding_k3.py`); no Jinja template of it ships, so the
test tokenizer keeps the demo model's template and the family is told by the vocabulary, as mlx-lm tells
it. A forced call's grammar compiles, accepts the call as K3 writes it and parses back as it streams; the
reader keeps a value whose text holds an end marker. canitoolcall's fixtures check the rest
(`test_family_fixtures.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llguidance import LLMatcher

from pipeline.events import CompletionEvent, TextDelta, ToolCall, ToolCallDelta, ToolCallStart
from pipeline.requests import Constraint, ConstraintKind, Tool, ToolChoice, ToolChoiceMode
from stages.families import choose_family, kimi_k3
from stages.families.base import Family
from stages.models.demo_variants import derive_demo_model
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.constraint_choice import tool_call_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.reply.markup import Section, markers_for, splitter_for

WEATHER = Tool(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
)
EVENT = Tool(
    name="create_event",
    parameters={
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "minutes": {"type": "integer"},
            "reminder": {"type": ["integer", "null"]},
            "where": {"type": "object"},
        },
        "required": ["title", "minutes"],
    },
)
TIME = Tool(name="get_time", parameters={"type": "object", "properties": {}})
SHOUT = Tool(
    name="shout",
    parameters={"type": "object", "properties": {"input": {"type": "string"}}},
    input_grammar=Constraint(kind=ConstraintKind.REGEX, spec="[A-Z]+!", param="tools[3].format.definition"),
)
TOOLS = (WEATHER, EVENT, TIME, SHOUT)


def xtml(name: str, attributes: str = "", body: str = "") -> str:
    return f"<|open|>{name}{attributes}<|sep|>{body}<|close|>{name}<|sep|>"


def argument(key: str, kind: str, value: str) -> str:
    return xtml("argument", f' key="{key}" type="{kind}"', value)


def section(tool: str, *arguments: str) -> str:
    return xtml("tools", body=xtml("call", f' tool="{tool}" index="1"', "".join(arguments)))


PARIS = section("get_weather", argument("city", "string", "Paris"))


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    template = (tiny_model / "chat_template.jinja").read_text(encoding="utf-8")
    path = derive_demo_model(
        tiny_model,
        tmp_path_factory.mktemp("kimi-k3"),
        template=template,
        special_tokens=kimi_k3.VOCABULARY,
        bos=None,
        eos=("<|end_of_msg|>",),
    )
    return load_tokenizer(resolve_model(str(path)))


def feed(family: Family, pieces: list[str], section: Section = Section.ANSWER) -> list[CompletionEvent]:
    splitter = splitter_for(family, markers_for(family, TOOLS, parse_tools=True, forced=True), section)
    events = [event for piece in pieces for event in splitter.feed(piece)]
    return events + splitter.feed("", final=True)


def compiled(tokenizer: Tokenizer, family: Family, choice: ToolChoice) -> LLMatcher:
    """A matcher of the forced-call grammar for `choice`."""
    vocab = len(tokenizer.get_vocab())  # type: ignore[attr-defined]
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=vocab, family=family)
    return compiler.compile(tool_call_constraint(tokenizer, family, TOOLS, choice)).matcher()


def calls(events: list[CompletionEvent]) -> list[tuple[str, object]]:
    return [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]


def test_k3_is_told_by_its_vocabulary(tokenizer: Tokenizer) -> None:
    family = choose_family(tokenizer)
    assert family.name == "kimi_k3"
    assert family.think == ("<|open|>think<|sep|>", "<|close|>think<|sep|>")


@pytest.mark.parametrize("mode", [ToolChoiceMode.NAMED, ToolChoiceMode.REQUIRED])
def test_forced_call_is_k3_markup_and_streams_back(tokenizer: Tokenizer, mode: ToolChoiceMode) -> None:
    family = choose_family(tokenizer)
    choice = ToolChoice(mode=mode, name="get_weather" if mode is ToolChoiceMode.NAMED else None)
    matcher = compiled(tokenizer, family, choice)
    assert matcher.consume_tokens(tokenizer.encode(PARIS, add_special_tokens=False)), matcher.get_error()
    assert matcher.is_accepting()
    events = feed(family, list(PARIS))
    assert calls(events) == [("get_weather", {"city": "Paris"})]
    starts = [i for i, e in enumerate(events) if isinstance(e, ToolCallStart)]
    pieces = [e.arguments for e in events if isinstance(e, ToolCallDelta)]
    assert len(starts) == 1 and len(pieces) >= len("Paris")
    assert "".join(pieces) == next(e.arguments for e in events if isinstance(e, ToolCall))
    assert not any(isinstance(e, TextDelta) for e in events)


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        (section("create_event", argument("title", "string", "Standup"), argument("minutes", "number", "15")), True),
        (
            section(
                "create_event",
                argument("title", "string", "Offsite"),
                argument("minutes", "number", "90"),
                argument("reminder", "null", "null"),
                argument("where", "object", '{"floor": 2}'),
            ),
            True,
        ),
        (section("get_time"), True),
        (
            xtml(
                "tools",
                body=xtml("call", ' tool="shout" index="1"', xtml("json", ' type="object"', '{"input": "HEY!"}')),
            ),
            True,
        ),
        (
            xtml(
                "tools",
                body=xtml("call", ' tool="shout" index="1"', xtml("json", ' type="object"', '{"input": "hey"}')),
            ),
            False,
        ),
        (section("get_weather", argument("city", "string", "Rome"), argument("unit", "string", "kelvin")), False),
        (section("create_event", argument("title", "string", "Standup")), False),
        (section("create_event", argument("title", "string", "x"), argument("minutes", "string", "15")), False),
    ],
)
def test_forced_grammar_holds_each_value_to_its_schema(tokenizer: Tokenizer, text: str, accepted: bool) -> None:
    family = choose_family(tokenizer)
    matcher = compiled(tokenizer, family, ToolChoice(mode=ToolChoiceMode.REQUIRED))
    assert (matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()) is (
        accepted
    )
    if accepted:
        assert len(calls(feed(family, [text]))) == 1


def test_a_value_may_hold_the_text_of_end_markers() -> None:
    """An end marker that no element's start or the call's end follows is the value's text, the section's too."""
    content = "ends with <|close|>argument<|sep|> or <|close|>tools<|sep|>, see"
    text = section("get_weather", argument("city", "string", content))
    for pieces in (list(text), [text]):
        assert calls(feed(kimi_k3.FAMILY, pieces)) == [("get_weather", {"city": content})]


def test_arguments_in_one_json_element() -> None:
    text = xtml(
        "tools", body=xtml("call", ' tool="get_weather" index="1"', xtml("json", ' type="object"', '{"city": "Oslo"}'))
    )
    events = feed(kimi_k3.FAMILY, list(text))
    assert calls(events) == [("get_weather", {"city": "Oslo"})]
    assert "".join(e.arguments for e in events if isinstance(e, ToolCallDelta)) == '{"city": "Oslo"}'


def test_escaped_attributes_and_typed_values() -> None:
    text = section(
        "create_event",
        argument("q&amp;a", "string", "fish & chips"),
        argument("say &quot;hi&quot;", "number", "1.5"),
        argument("flags", "array", "[true, null]"),
    )
    assert calls(feed(kimi_k3.FAMILY, [text])) == [
        ("create_event", {"q&a": "fish & chips", 'say "hi"': 1.5, "flags": [True, None]})
    ]


def test_a_call_cut_inside_its_open_tag_leaks_nothing() -> None:
    text = '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_time" index="1"'
    events = feed(kimi_k3.FAMILY, list(text))
    assert events == []
