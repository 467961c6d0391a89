"""A response format beside tools: a forced call follows its tool's grammar (the format governs text, and a
forced turn writes none); under `auto` the first token chooses between text held to the format and calls
held to their tools' grammars, in every family whose calls open with one token."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest
from llguidance import LLMatcher

from pipeline.errors import RequestError
from pipeline.events import TextDelta, ToolCall
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
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.constraint_choice import constraint_of, tool_call_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.reply.markup import markers_for, splitter_for
from tests.families import CASES
from tests.stages.families.test_custom_grammar_calls import WEATHER, family_tokenizer, walk

__all__ = ["family_tokenizer"]

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
FORMATS = {
    "json_schema": Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=ANSWER, param="response_format"),
    "regex": Constraint(kind=ConstraintKind.REGEX, spec="(yes|no)/[0-9]", param="guided_regex"),
    "choice": Constraint(kind=ConstraintKind.CHOICE, spec=["alpha", "beta"], param="guided_choice"),
}


def chat(choice: ToolChoice, text: Constraint, *, tools: tuple[Tool, ...] = (WEATHER,)) -> ChatRequest:
    params = GenerationParams(max_tokens=8, sampling=Sampling(), constraint=text)
    messages = (Message(role=Role.USER, content="hi"),)
    return ChatRequest(messages=messages, params=params, tools=tools, tool_choice=choice)


def compiler_for(tokenizer: Tokenizer) -> ConstraintCompiler:
    vocab_size = len(tokenizer.get_vocab())  # type: ignore[attr-defined]
    return ConstraintCompiler(tokenizer=tokenizer, vocab_size=vocab_size, family=choose_family(tokenizer))


def events_of(tokenizer: Tokenizer, tokens: list[int]) -> list[object]:
    family = choose_family(tokenizer)
    text = tokenizer.decode(tokens)
    return list(splitter_for(family, markers_for(family, (WEATHER,), parse_tools=True)).feed(text, final=True))


def walk_text(tokenizer: Tokenizer, matcher: LLMatcher, *, seed: int | None, opener: int) -> list[int]:
    """Tokens the grammar allows, never the call opener, up to the first EOS it allows."""
    rng = random.Random(seed)
    eos = set(tokenizer.eos_token_ids)
    tokens: list[int] = []
    for _ in range(400):
        mask = matcher.compute_bitmask()
        allowed = [i for i in range(len(mask) * 8) if mask[i // 8] >> (i % 8) & 1 and i != opener]
        if eos & set(allowed):
            break
        choice = allowed[0] if seed is None else rng.choice(allowed)
        assert matcher.consume_token(choice), matcher.get_error()
        tokens.append(choice)
    return tokens


def held_beside(tokenizer: Tokenizer, text: Constraint) -> bool:
    """False where no single token opens the family's calls (DeepSeek's DSML): then a format beside tools under
    `auto` is refused by name."""
    family = choose_family(tokenizer)
    if family.trigger is not None:
        return True
    with pytest.raises(RequestError, match="do not open with one token"):
        constraint_of(tokenizer, family, chat(ToolChoice(), text))
    return False


FORCED = [ToolChoice(mode=ToolChoiceMode.REQUIRED), ToolChoice(mode=ToolChoiceMode.NAMED, name="get_weather")]


@pytest.mark.parametrize("choice", FORCED, ids=["required", "named"])
def test_a_forced_call_beside_a_format_follows_the_tools_grammar(
    family_tokenizer: Tokenizer, choice: ToolChoice
) -> None:
    tokenizer = family_tokenizer
    family = choose_family(tokenizer)
    constraint = constraint_of(tokenizer, family, chat(choice, FORMATS["json_schema"]))
    assert constraint == tool_call_constraint(tokenizer, family, (WEATHER,), choice)


@pytest.mark.parametrize("seed", [None, 4])
def test_a_call_opened_beside_a_format_matches_its_schema(family_tokenizer: Tokenizer, seed: int | None) -> None:
    tokenizer = family_tokenizer
    if not held_beside(tokenizer, FORMATS["json_schema"]):
        return
    family = choose_family(tokenizer)
    constraint = constraint_of(tokenizer, family, chat(ToolChoice(), FORMATS["json_schema"]))
    assert constraint is not None and family.trigger is not None
    opener = tokenizer.encode(family.trigger, add_special_tokens=False)[0]
    tokens = walk(tokenizer, compiler_for(tokenizer).compile(constraint).matcher(), seed=seed, open_at=0, opener=opener)
    [call] = [event for event in events_of(tokenizer, tokens) if isinstance(event, ToolCall)]
    assert json.loads(call.arguments) == {"city": "Paris"}


@pytest.mark.parametrize("kind", sorted(FORMATS))
@pytest.mark.parametrize("seed", [None, 9])
def test_text_beside_tools_follows_the_format(family_tokenizer: Tokenizer, kind: str, seed: int | None) -> None:
    tokenizer = family_tokenizer
    if not held_beside(tokenizer, FORMATS[kind]):
        return
    family = choose_family(tokenizer)
    constraint = constraint_of(tokenizer, family, chat(ToolChoice(), FORMATS[kind]))
    assert constraint is not None
    matcher = compiler_for(tokenizer).compile(constraint).matcher()
    assert family.trigger is not None
    opener = tokenizer.encode(family.trigger, add_special_tokens=False)[0]
    tokens = walk_text(tokenizer, matcher, seed=seed, opener=opener)
    events = events_of(tokenizer, tokens)
    assert not [event for event in events if isinstance(event, ToolCall)]
    text = "".join(event.text for event in events if isinstance(event, TextDelta))
    if kind == "json_schema":
        jsonschema.validate(json.loads(text), ANSWER)
    elif kind == "regex":
        assert text in {f"{word}/{digit}" for word in ("yes", "no") for digit in range(10)}
    else:
        assert text in ("alpha", "beta")


def harmony_tokenizer(tiny_model: Path, folder: Path) -> Tokenizer:
    case = next(case for case in CASES if case.name == "harmony")
    return load_tokenizer(resolve_model(str(case.build(tiny_model, folder))))


def test_a_format_beside_tools_on_gpt_oss_is_refused_by_name(tiny_model: Path, tmp_path: Path) -> None:
    tokenizer = harmony_tokenizer(tiny_model, tmp_path)
    with pytest.raises(RequestError) as caught:
        constraint_of(tokenizer, choose_family(tokenizer), chat(ToolChoice(), FORMATS["json_schema"]))
    assert caught.value.param == "response_format"
    assert "tool_choice 'auto'" in str(caught.value)


def test_a_forced_call_beside_a_format_on_gpt_oss_follows_the_call(tiny_model: Path, tmp_path: Path) -> None:
    tokenizer = harmony_tokenizer(tiny_model, tmp_path)
    constraint = constraint_of(tokenizer, choose_family(tokenizer), chat(FORCED[0], FORMATS["json_schema"]))
    assert constraint is not None and constraint.param == "tool_choice"
