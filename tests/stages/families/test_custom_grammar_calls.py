"""A custom tool's Lark grammar (and a `strict` tool's schema) holds its input inside every family's call
markup: forced (`required`) and where the model opens a call itself under
`auto`. Each family's random walk through the compiled grammar, seeded
and greedy (lowest allowed id), is decoded and read back by the family's
splitter; the call's input must parse under the tool's own grammar."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from llguidance import LLMatcher

from pipeline.errors import RequestError
from pipeline.events import ToolCall
from pipeline.requests import (
    ChatRequest,
    Constraint,
    ConstraintKind,
    GenerationParams,
    Message,
    Role,
    Sampling,
    Tool,
    ToolChoice,
    ToolChoiceMode,
)
from stages.families import choose_family
from stages.families.json_image import json_string_lark
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.constraint_choice import constraint_of, tool_call_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.reply.markup import markers_for, splitter_for
from tests.families import CASES, FamilyCase

# Quotes and newlines in the input, so its escaped form is what is held.
GRAMMAR = 'start: say (LF say)?\nsay: "say \\"" WORD "\\""\nWORD: /[a-z]{1,6}/\n%import common.LF\n'
APPLY_PATCH = r"""
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
%import common.LF
"""
CUSTOM = Tool(
    name="shout",
    description="Says words.",
    parameters={"type": "object", "properties": {"input": {"type": "string"}}},
    input_grammar=Constraint(kind=ConstraintKind.GRAMMAR, spec=GRAMMAR, param="tools[0].format.definition"),
)
WEATHER = Tool(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
HELD = [case for case in CASES if case.name not in ("harmony", "json")]


@pytest.fixture(scope="module", params=HELD, ids=[case.name for case in HELD])
def family_tokenizer(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Tokenizer:
    case: FamilyCase = request.param
    return load_tokenizer(resolve_model(str(case.build(tiny_model, tmp_path_factory.mktemp(case.name)))))


def chat(choice: ToolChoice, tools: tuple[Tool, ...] = (CUSTOM, WEATHER)) -> ChatRequest:
    messages = (Message(role=Role.USER, content="hi"),)
    return ChatRequest(
        messages=messages, params=GenerationParams(max_tokens=8, sampling=Sampling()), tools=tools, tool_choice=choice
    )


def accepts(tokenizer: Tokenizer, grammar: str, text: str) -> bool:
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()))  # type: ignore[attr-defined]
    matcher = compiler.compile(Constraint(kind=ConstraintKind.GRAMMAR, spec=grammar, param="g")).matcher()
    return matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)) and matcher.is_accepting()


def walk(
    tokenizer: Tokenizer, matcher: LLMatcher, *, seed: int | None, open_at: int | None, opener: int | None
) -> list[int]:
    """Tokens the grammar allows: seeded choices (or the lowest id), the opener at `open_at`, EOS once a call is
    made."""
    rng = random.Random(seed)
    eos = set(tokenizer.eos_token_ids)
    tokens: list[int] = []
    for step in range(400):
        mask = matcher.compute_bitmask()
        allowed = [i for i in range(len(mask) * 8) if mask[i // 8] >> (i % 8) & 1]
        called = opener is None or opener in tokens
        if called and eos & set(allowed):
            break
        if opener is not None and step == open_at:
            choice = opener
        else:
            plain = [token for token in allowed if token not in eos and token != opener] or allowed
            choice = plain[0] if seed is None else rng.choice(plain)
        assert matcher.consume_token(choice), matcher.get_error()
        tokens.append(choice)
    return tokens


def refused_under_auto(tokenizer: Tokenizer, tools: tuple[Tool, ...] = (CUSTOM, WEATHER)) -> bool:
    """True where no single token opens the family's calls (DeepSeek's DSML): then a call it opens under
    `auto` cannot be held, and the request is refused by name rather than left loose."""
    family = choose_family(tokenizer)
    if family.trigger is not None:
        return False
    with pytest.raises(RequestError, match="do not open with one token"):
        constraint_of(tokenizer, family, chat(ToolChoice(), tools=tools))
    return True


def read_input(tokenizer: Tokenizer, tokens: list[int], *, forced: bool) -> str:
    family = choose_family(tokenizer)
    text = tokenizer.decode(tokens)
    events = splitter_for(family, markers_for(family, (CUSTOM, WEATHER), parse_tools=True, forced=forced)).feed(
        text, final=True
    )
    calls = [event for event in events if isinstance(event, ToolCall) and event.name == "shout"]
    assert calls, (text, events)
    value: str = json.loads(calls[0].arguments)["input"]
    return value


@pytest.mark.parametrize("seed", [None, 3, 11])
def test_auto_call_opened_by_the_model_follows_the_grammar(family_tokenizer: Tokenizer, seed: int | None) -> None:
    tokenizer = family_tokenizer
    if refused_under_auto(tokenizer, (CUSTOM,)):
        return
    family = choose_family(tokenizer)
    constraint = constraint_of(tokenizer, family, chat(ToolChoice(), tools=(CUSTOM,)))
    assert constraint is not None
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()), family=family)  # type: ignore[attr-defined]
    matcher = compiler.compile(constraint).matcher()
    assert family.trigger is not None
    opener = tokenizer.encode(family.trigger, add_special_tokens=False)[0]
    tokens = walk(tokenizer, matcher, seed=seed, open_at=3, opener=opener)
    text = read_input(tokenizer, tokens, forced=False)
    assert accepts(tokenizer, GRAMMAR, text), text


@pytest.mark.parametrize("seed", [None, 5])
def test_required_call_to_a_custom_tool_follows_the_grammar(family_tokenizer: Tokenizer, seed: int | None) -> None:
    tokenizer = family_tokenizer
    family = choose_family(tokenizer)
    constraint = tool_call_constraint(tokenizer, family, (CUSTOM,), ToolChoice(mode=ToolChoiceMode.REQUIRED))
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()), family=family)  # type: ignore[attr-defined]
    tokens = walk(tokenizer, compiler.compile(constraint).matcher(), seed=seed, open_at=None, opener=None)
    text = read_input(tokenizer, tokens, forced=True)
    assert accepts(tokenizer, GRAMMAR, text), text


def test_apply_patch_grammar_holds_its_escaped_form(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(resolve_model(str(tiny_model)))
    image = json_string_lark(APPLY_PATCH)
    patch = '*** Begin Patch\n*** Add File: a "q".py\n+print("hi\\tthere")\n+\tx\n*** End Patch\n'
    assert accepts(tokenizer, APPLY_PATCH, patch)
    assert accepts(tokenizer, image, json.dumps(patch)[1:-1])
    assert not accepts(tokenizer, image, patch)


@pytest.mark.parametrize(
    "grammar",
    ['start: <|im_end|> "x"', 'start: "abc"i', "start: %json {}", 'start: "a" @other', "%import foo.BAR\nstart: BAR"],
)
def test_a_grammar_that_cannot_be_carried_is_refused_by_name(tiny_model: Path, grammar: str) -> None:
    tokenizer = load_tokenizer(resolve_model(str(tiny_model)))
    tool = Tool(
        name="t",
        input_grammar=Constraint(kind=ConstraintKind.GRAMMAR, spec=grammar, param="tools[0].format.definition"),
    )
    with pytest.raises(RequestError) as caught:
        tool_call_constraint(tokenizer, choose_family(tokenizer), (tool,), ToolChoice(mode=ToolChoiceMode.REQUIRED))
    assert caught.value.param == "tools[0].format.definition"


def test_gpt_oss_under_auto_is_refused_by_name(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    case = next(case for case in CASES if case.name == "harmony")
    tokenizer = load_tokenizer(resolve_model(str(case.build(tiny_model, tmp_path_factory.mktemp("harmony")))))
    with pytest.raises(RequestError) as caught:
        constraint_of(tokenizer, choose_family(tokenizer), chat(ToolChoice()))
    assert caught.value.param == "tools[0].format.definition"
    assert "tool_choice 'auto'" in str(caught.value)


def test_auto_grammar_takes_function_calls_and_custom_calls_side_by_side(family_tokenizer: Tokenizer) -> None:
    tokenizer = family_tokenizer
    if refused_under_auto(tokenizer):
        return
    family = choose_family(tokenizer)
    constraint = constraint_of(tokenizer, family, chat(ToolChoice()))
    assert constraint is not None
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()), family=family)  # type: ignore[attr-defined]
    forced_weather = compiler.compile(
        tool_call_constraint(tokenizer, family, (WEATHER,), ToolChoice(mode=ToolChoiceMode.REQUIRED))
    )
    weather = tokenizer.decode(walk(tokenizer, forced_weather.matcher(), seed=None, open_at=None, opener=None))
    matcher = compiler.compile(constraint).matcher()
    text = "Sure. " + weather + "\n"
    assert matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False)), (text, matcher.get_error())
    assert not matcher.is_error()


@pytest.mark.parametrize("seed", [None, 7])
def test_strict_function_call_under_auto_matches_its_schema(family_tokenizer: Tokenizer, seed: int | None) -> None:
    tokenizer = family_tokenizer
    family = choose_family(tokenizer)
    strict = Tool(name="get_weather", parameters=WEATHER.parameters, strict=True)
    if refused_under_auto(tokenizer, (strict,)):
        return
    constraint = constraint_of(tokenizer, family, chat(ToolChoice(), tools=(strict,)))
    assert constraint is not None
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()), family=family)  # type: ignore[attr-defined]
    assert family.trigger is not None
    opener = tokenizer.encode(family.trigger, add_special_tokens=False)[0]
    tokens = walk(tokenizer, compiler.compile(constraint).matcher(), seed=seed, open_at=2, opener=opener)
    text = tokenizer.decode(tokens)
    events = splitter_for(family, markers_for(family, (strict,), parse_tools=True)).feed(text, final=True)
    [call] = [event for event in events if isinstance(event, ToolCall)]
    assert json.loads(call.arguments) == {"city": "Paris"}, text


def test_a_tool_without_strict_or_grammar_leaves_auto_free(family_tokenizer: Tokenizer) -> None:
    assert (
        constraint_of(family_tokenizer, choose_family(family_tokenizer), chat(ToolChoice(), tools=(WEATHER,))) is None
    )


def test_strict_under_auto_on_gpt_oss_is_refused_by_name(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    case = next(case for case in CASES if case.name == "harmony")
    tokenizer = load_tokenizer(resolve_model(str(case.build(tiny_model, tmp_path_factory.mktemp("harmony-strict")))))
    strict = Tool(name="get_weather", parameters=WEATHER.parameters, strict=True)
    with pytest.raises(RequestError) as caught:
        constraint_of(tokenizer, choose_family(tokenizer), chat(ToolChoice(), tools=(strict,)))
    assert "'get_weather'" in str(caught.value) and "strict" in str(caught.value)
