"""The one-element-per-parameter markups (Qwen3-Coder, GLM, MiniMax) on tokenizers with their real
templates and special tokens: the forced grammar, walked token by token, takes each value as its
JSON-schema type says (an integer as digits, an enum as one of its strings, an object as JSON, a
string as text within its length) and refuses what the schema does not allow; what it takes
parses back, streamed, into the typed arguments. Written freely, every call is read and a tag
inside a value is its text. A markup only mlx-lm reads is refused by name."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import attrs
import pytest

from pipeline.errors import RequestError
from pipeline.events import TextDelta, ToolCall, ToolCallDelta
from pipeline.requests import Tool, ToolChoice, ToolChoiceMode
from stages.families import FAMILIES, choose_family, glm, minimax, qwen3_coder
from stages.families.mlxlm import _unsupported
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.constraint_choice import tool_call_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.reply.markup import markers_for, splitter_for
from tests.families import CASES, FamilyCase

TOOL = Tool(
    name="plan",
    parameters={
        "type": "object",
        "properties": {
            "count": {"type": "integer", "minimum": 0},
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "options": {"type": "object", "properties": {"deep": {"type": "boolean"}}, "required": ["deep"]},
            "note": {"type": "string", "maxLength": 8},
        },
        "required": ["count", "mode"],
    },
)


def written(family: str, values: dict[str, str]) -> str:
    """A call to `plan` with `values` (as text) in the family's own layout."""
    if family == "qwen3_coder":
        body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
        return f"<tool_call>\n<function=plan>\n{body}</function>\n</tool_call>"
    if family == "glm":
        body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in values.items())
        return f"<tool_call>plan\n{body}</tool_call>"
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in values.items())
    return f'<minimax:tool_call>\n<invoke name="plan">\n{body}</invoke>\n</minimax:tool_call>'


XML = [case for case in CASES if case.name in (qwen3_coder.FAMILY.name, glm.FAMILY.name, minimax.FAMILY.name)]


@pytest.fixture(scope="module", params=XML, ids=[case.name for case in XML])
def family_tokenizer(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Tokenizer]:
    case: FamilyCase = request.param
    return case.name, load_tokenizer(resolve_model(str(case.build(tiny_model, tmp_path_factory.mktemp(case.name)))))


def takes(tokenizer: Tokenizer, text: str) -> bool:
    family = choose_family(tokenizer)
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()), family=family)  # type: ignore[attr-defined]
    constraint = tool_call_constraint(tokenizer, family, (TOOL,), ToolChoice(mode=ToolChoiceMode.NAMED, name="plan"))
    matcher = compiler.compile(constraint).matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


GOOD = {"count": "12", "mode": "slow", "options": '{"deep": true}', "note": "a <b> c"}


def test_typed_values_are_taken_and_parse_back_typed(family_tokenizer: tuple[str, Tokenizer]) -> None:
    name, tokenizer = family_tokenizer
    text = written(name, GOOD)
    assert takes(tokenizer, text), text
    family = choose_family(tokenizer)
    splitter = splitter_for(family, markers_for(family, (TOOL,), parse_tools=True, forced=True))
    events = [event for char in text for event in splitter.feed(char)] + splitter.feed("", final=True)
    (call,) = [e for e in events if isinstance(e, ToolCall)]
    assert json.loads(call.arguments) == {"count": 12, "mode": "slow", "options": {"deep": True}, "note": "a <b> c"}
    assert "".join(e.arguments for e in events if isinstance(e, ToolCallDelta)) == call.arguments
    assert takes(tokenizer, written(name, {"count": "0", "mode": "fast"})), "optional parameters may be left out"


@pytest.mark.parametrize(
    "bad",
    [
        {"count": "twelve", "mode": "slow"},
        {"count": "-1", "mode": "slow"},
        {"count": "1", "mode": "medium"},
        {"count": "1", "mode": "slow", "options": '{"deep": "yes"}'},
        {"count": "1", "mode": "slow", "note": "far too long"},
        {"mode": "slow"},
    ],
    ids=[
        "word-for-integer",
        "below-minimum",
        "not-in-enum",
        "object-off-schema",
        "past-max-length",
        "required-missing",
    ],
)
def test_values_off_their_schema_are_refused(family_tokenizer: tuple[str, Tokenizer], bad: dict[str, str]) -> None:
    name, tokenizer = family_tokenizer
    assert not takes(tokenizer, written(name, bad))


# A value holding its own closing tag and the section's end marker inline, then a second call; in the family's layout.
INLINE = "a </parameter> b </arg_value> c </tool_call> d </minimax:tool_call> e"
SECTIONS = {
    "qwen3_coder": (
        f"<tool_call>\n<function=plan>\n<parameter=note>\n{INLINE}\n</parameter>\n<parameter=count>\n1\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=plan>\n<parameter=count>\n2\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
    "glm": (
        f"<tool_call>plan<arg_key>note</arg_key><arg_value>{INLINE}</arg_value><arg_key>count</arg_key>"
        "<arg_value>1</arg_value></tool_call><tool_call>plan<arg_key>count</arg_key><arg_value>2</arg_value></tool_call>"
    ),
    "minimax": (
        f'<minimax:tool_call>\n<invoke name="plan">\n<parameter name="note">{INLINE}</parameter>\n'
        '<parameter name="count">1</parameter>\n</invoke>\n<invoke name="plan">\n'
        '<parameter name="count">2</parameter>\n</invoke>\n</minimax:tool_call>'
    ),
}


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_calls_with_markup_in_a_value_stream_whole(name: str) -> None:
    """Every call is read (MiniMax's several `<invoke>`s in one section too), a tag inside a value is its text,
    and each call's streamed pieces join to its arguments, fed whole or a character at a time."""
    family = FAMILIES[name]
    for pieces in ([SECTIONS[name]], list(SECTIONS[name])):
        splitter = splitter_for(family, markers_for(family, (TOOL,), parse_tools=True))
        events = [event for piece in pieces for event in splitter.feed(piece)] + splitter.feed("", final=True)
        calls = [e for e in events if isinstance(e, ToolCall)]
        assert [json.loads(call.arguments) for call in calls] == [{"note": INLINE, "count": 1}, {"count": 2}]
        for call in calls:
            streamed = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta) and e.index == call.index)
            assert streamed in ("", call.arguments), (call, streamed)
        assert not any(isinstance(e, TextDelta) for e in events), events


def test_a_markup_only_mlx_lm_reads_is_refused_by_name(tiny_model: Path) -> None:
    tokenizer = load_tokenizer(resolve_model(str(tiny_model)))
    family = choose_family(tokenizer)
    pythonic = attrs.evolve(family, forced=partial(_unsupported, "pythonic"))
    with pytest.raises(RequestError) as caught:
        tool_call_constraint(tokenizer, pythonic, (TOOL,), ToolChoice(mode=ToolChoiceMode.REQUIRED))
    assert caught.value.param == "tool_choice" and "'pythonic'" in str(caught.value)
