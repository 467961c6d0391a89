"""Gemma 4's family (`stages/families/gemma4*.py`) on a tokenizer with Gemma 4's real templates and
special tokens (`tests/families.py`): detection, the forced and held-call grammars against what the
template writes, the thinking flag read from the rendered prompt, and a reply through the sink.
(The notation reader and the splitter alone: `test_gemma4_notation.py`.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from pipeline.channels import Channel, open_channel
from pipeline.events import CompletionEvent, FinishReason, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import (
    Accepted,
    ChatRequest,
    Constraint,
    ConstraintKind,
    GenerationParams,
    Message,
    Role,
    Sampling,
    Tool,
    ToolCallRecord,
    ToolChoice,
    ToolChoiceMode,
)
from pipeline.tracing import Timeline
from stages.families import choose_family, gemma4
from stages.messages import Abort, Admitted, Prepared, Reply, StepOutputs, TokenDelta
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.chat import render_chat_text
from stages.prompt.constraint_choice import free_call_constraint, tool_call_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.reply.markup import markers_for, splitter_for
from stages.reply.sink import CompletionSink
from tests.families import CASES

Q = '<|"|>'
PLAN = Tool(
    name="plan",
    parameters={
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "Priority": {"type": "string", "enum": ["low", "high"]},
            "days": {"type": "integer"},
            "ratio": {"type": "number"},
            "done": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "owner": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                "required": ["name"],
            },
            "note": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        },
        "required": ["title", "days"],
    },
)
# Gemma 4's real templates: the one `tests/families.py` builds, and the E4B and 26B-A4B ones.
TEMPLATES = ("google-gemma-4-31B-it", "google-gemma-4-E4B-it", "google-gemma-4-26B-A4B-it")
WEATHER = Tool(
    name="get-weather.now",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    (case,) = [case for case in CASES if case.name == "gemma4"]
    return load_tokenizer(resolve_model(str(case.build(tiny_model, tmp_path_factory.mktemp("gemma4")))))


def test_family_and_think_markers_are_detected(tokenizer: Tokenizer) -> None:
    family = choose_family(tokenizer)
    assert (family.name, family.think) == ("gemma4", gemma4.THINK)


def template_call(tokenizer: Tokenizer, arguments: dict[str, object]) -> str:
    """The call as Gemma 4's chat template renders it in the history."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "plan", "arguments": arguments}}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert isinstance(text, str)
    found = re.search(r"<\|tool_call>.*?<tool_call\|>", text, re.DOTALL)
    assert found is not None, text
    return found.group()


def calls_in(text: str) -> list[ToolCall]:
    """The calls the family's splitter reads out of `text`, whole."""
    splitter = splitter_for(gemma4.FAMILY, markers_for(gemma4.FAMILY, (PLAN, WEATHER), parse_tools=True))
    return [e for e in splitter.feed(text, final=True) if isinstance(e, ToolCall)]


def accepts(tokenizer: Tokenizer, choice: ToolChoice, text: str) -> bool:
    vocab = len(tokenizer.get_vocab())  # type: ignore[attr-defined]
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=vocab, family=gemma4.FAMILY)
    matcher = compiler.compile(tool_call_constraint(tokenizer, gemma4.FAMILY, (PLAN, WEATHER), choice)).matcher()
    return bool(matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False))) and matcher.is_accepting()


@pytest.mark.parametrize(
    "arguments",
    [
        {"title": "Trip", "days": 3},
        {
            "title": 'Say "hi" {now}',
            "Priority": "high",
            "days": -2,
            "ratio": 0.25,
            "done": False,
            "tags": ["a", "b c"],
            "owner": {"name": "Ana", "email": "a@b.c"},
            "note": 7,
        },
        {"title": "", "days": 0, "tags": [], "note": "n", "owner": {"name": "Bo"}},
    ],
)
def test_forced_grammar_accepts_what_the_template_writes(tokenizer: Tokenizer, arguments: dict[str, object]) -> None:
    text = template_call(tokenizer, arguments)
    assert accepts(tokenizer, ToolChoice(mode=ToolChoiceMode.NAMED, name="plan"), text), text
    assert accepts(tokenizer, ToolChoice(mode=ToolChoiceMode.REQUIRED), text), text
    (call,) = calls_in(text)
    assert json.loads(call.arguments) == arguments


@pytest.mark.parametrize(
    "arguments",
    [
        f"title:{Q}Trip{Q}",  # a required member left out
        f"days:3,title:{Q}{'x' * 41}{Q}",  # past maxLength
        f"Priority:{Q}urgent{Q},days:3,title:{Q}T{Q}",  # not in the enum
        f"days:3.5,title:{Q}T{Q}",  # not an integer
        f"days:3,title:{Q}T{Q},extra:1",  # not declared
        f"title:{Q}T{Q},days:3",  # out of the template's order
        f"days:3, title:{Q}T{Q}",  # whitespace the template never writes
    ],
)
def test_forced_grammar_refuses_what_breaks_the_schema(tokenizer: Tokenizer, arguments: str) -> None:
    text = f"<|tool_call>call:plan{{{arguments}}}<tool_call|>"
    assert not accepts(tokenizer, ToolChoice(mode=ToolChoiceMode.NAMED, name="plan"), text)


@pytest.mark.parametrize(
    ("call", "held"),
    [
        (f"call:get-weather.now{{city:{Q}Oslo{Q}}}", True),
        (f"call:shout{{input:{Q}HEY{Q}}}", True),
        ("call:get-weather.now{town:", False),
        (f"call:shout{{input:{Q}hey", False),
    ],
)
def test_held_calls_under_auto_open_at_the_call_token(tokenizer: Tokenizer, call: str, held: bool) -> None:
    """`lazy.py`'s grammar: free text, then a call held to its tool from `<|tool_call>` on (a strict
    tool to its schema, a custom tool's input to its grammar, written raw: the notation escapes nothing)."""
    shout = Tool(name="shout", input_grammar=Constraint(kind=ConstraintKind.REGEX, spec="[A-Z]+", param="tools"))
    tools = (PLAN, attrs.evolve(WEATHER, strict=True), shout)
    vocab = len(tokenizer.get_vocab())  # type: ignore[attr-defined]
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=vocab, family=gemma4.FAMILY)
    matcher = compiler.compile(free_call_constraint(tokenizer, gemma4.FAMILY, tools)).matcher()
    text = f"Sure. <|tool_call>{call}" + ("<tool_call|>" if held else "")
    assert bool(matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False))) is held
    if held:
        assert matcher.is_accepting()
        assert [c.name for c in calls_in(text)] == [call[5 : call.index("{")]]


def chat(**kwargs: Any) -> ChatRequest:
    kwargs.setdefault("messages", (Message(role=Role.USER, content="Weather in Oslo?"),))
    return ChatRequest(params=GenerationParams(max_tokens=64, sampling=Sampling()), tools=(WEATHER,), **kwargs)


@pytest.mark.parametrize("thinking", [False, True])
def test_the_prompt_opens_no_reasoning_either_way(tokenizer: Tokenizer, thinking: bool) -> None:
    """Thinking off, the template's prompt ends in an empty, closed thought channel; on, in the bare
    model turn, the model opening the channel itself: neither leaves the reply inside reasoning."""
    rendered = render_chat_text(
        tokenizer, chat(template_kwargs={"enable_thinking": thinking}), think=choose_family(tokenizer).think
    )
    assert rendered.text.endswith("<|turn>model\n" if thinking else "<|turn>model\n<|channel>thought\n<channel|>")
    assert not rendered.opens_reasoning


@pytest.fixture(scope="module", params=TEMPLATES)
def template_tokenizer(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Tokenizer]:
    (case,) = [case for case in CASES if case.name == "gemma4"]
    built = attrs.evolve(case, template=request.param).build(tiny_model, tmp_path_factory.mktemp(request.param))
    return request.param, load_tokenizer(resolve_model(str(built)))


@pytest.mark.parametrize("thinking", [False, True])
def test_after_a_tool_result_the_prompt_may_open_the_thought_channel(
    template_tokenizer: tuple[str, Tokenizer], thinking: bool
) -> None:
    """The E4B and 26B-A4B templates answer a tool result with thinking on by opening the channel
    (`<|channel>thought\\n`): the reply starts in reasoning. The 31B template's leaves it to the model."""
    template, tokenizer = template_tokenizer
    family = choose_family(tokenizer)
    assert (family.name, family.think) == ("gemma4", gemma4.THINK)
    request = chat(
        template_kwargs={"enable_thinking": thinking},
        messages=(
            Message(role=Role.USER, content="Weather in Oslo?"),
            Message(
                role=Role.ASSISTANT,
                content="",
                tool_calls=(ToolCallRecord(id="c1", name="get-weather.now", arguments='{"city": "Oslo"}'),),
            ),
            Message(role=Role.TOOL, content="sunny", tool_call_id="c1"),
        ),
    )
    rendered = render_chat_text(tokenizer, request, think=family.think)
    assert f"call:get-weather.now{{city:{Q}Oslo{Q}}}<tool_call|>" in rendered.text
    assert rendered.opens_reasoning is (thinking and template != TEMPLATES[0])


async def sink_events(tokenizer: Tokenizer, request: ChatRequest, text: str) -> list[CompletionEvent]:
    """`text`'s tokens through the sink, one a step, as the model thread sends them."""
    tokens = tokenizer.encode(text, add_special_tokens=False)
    reply = Reply("r1")
    reply.accept(Accepted(request=request, prompt_tokens=4))
    prepared = Prepared(
        request_id="r1",
        request=request,
        prompt_tokens=(1, 2, 3, 4),
        max_tokens=64,
        params=request.params,
        reply=reply,
        timeline=Timeline.start(clock=lambda: 1.0),
    )
    steps: Channel[StepOutputs] = open_channel(len(tokens) + 2, name="steps")
    control: Channel[Abort] = open_channel(4, name="control")
    sink = CompletionSink(inbox=steps.receive, aborts=control.send, tokenizer=tokenizer)
    deltas = [
        TokenDelta(request_id="r1", new_token_ids=(token,), finish=FinishReason.STOP if at == len(tokens) - 1 else None)
        for at, token in enumerate(tokens)
    ]
    with control.receive, anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(sink.run)
            async with steps.send:
                admitted = Admitted(prepared=prepared, admitted_at=1.5)
                await steps.send.send(StepOutputs(admitted=(admitted,), deltas=(), stepped_at=2.0))
                for delta in deltas:
                    await steps.send.send(StepOutputs(admitted=(), deltas=(delta,), stepped_at=3.0))
    return [event async for batch in reply for event in batch]


async def test_the_sink_reads_reasoning_and_a_call_in_gemma_tokens(tokenizer: Tokenizer) -> None:
    """The channel and quote tokens are special, yet reach the splitter (they are the family's markup)."""
    text = f"<|channel>thought\nCheck Oslo.\n<channel|><|tool_call>call:get-weather.now{{city:{Q}Oslo{Q}}}<tool_call|>"
    events = await sink_events(tokenizer, chat(), text)
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Check Oslo."
    assert not [e for e in events if isinstance(e, TextDelta)]
    assert [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)] == [
        ("get-weather.now", {"city": "Oslo"})
    ]
