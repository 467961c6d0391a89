"""The Mistral family against Mistral's own tokenizer library, `mistral-common`.

mistral-common encodes an assistant turn (reasoning, text, parallel calls)
the way Mistral's models are trained to write it; the project's splitter
reads that text back into the same reasoning, answer and calls, for the
array form (v3 tekken, v7 sentencepiece: Mistral-Small-3.1) and the
compact form (`[TOOL_CALLS]name[ARGS]{…}`, v11 and v13 with `[THINK]`).
The family's markers and the test model's special tokens are Mistral's.

mistral-common ships tokenizer files up to v7; the v11 and v13 encoders
run here on its tekken vocabulary with Mistral's special-token names
added, which gives their text exactly (the token ids are not checked).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mistral_common
import pytest
from mistral_common.protocol.instruct.messages import AssistantMessage, TextChunk, ThinkChunk, ToolMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall
from mistral_common.protocol.instruct.tool_calls import Tool as MistralTool
from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralCall
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy, SpecialTokens
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import Tool
from stages.families import mistral
from stages.families.base import Family
from stages.reply.markup import Markers, splitter_for
from tests.families import CASES

CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "Europe/Paris"})]
TOOLS = (Tool(name="get_weather"), Tool(name="get_time"))


def newer(version: str, tmp: Path) -> MistralTokenizer:
    """mistral-common's `version` encoder on its own tekken vocabulary, with every special token it names."""
    source = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    data: dict[str, Any] = json.loads(source.read_text(encoding="utf-8"))
    specials = [dict(token) for token in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    named = {str(token["token_str"]) for token in specials}
    specials += [
        {"rank": 0, "token_str": token.value, "is_control": True} for token in SpecialTokens if token.value not in named
    ]
    count = data["config"]["default_num_special_tokens"]
    specials += [{"rank": 0, "token_str": f"<SPECIAL_{i}>", "is_control": True} for i in range(len(specials), count)]
    for rank, token in enumerate(specials):
        token["rank"] = rank
    data["config"]["version"], data["special_tokens"] = version, specials
    data.pop("image", None)
    path = tmp / f"tekken-{version}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return MistralTokenizer.from_file(path)


# version -> (tokenizer, family, what the turn holds besides its calls: "", "text" or "think")
TOKENIZERS = {
    "v3-tekken": (lambda tmp: MistralTokenizer.v3(is_tekken=True), mistral.FAMILY, ""),  # v3: calls or text, not both
    "v7": (lambda tmp: MistralTokenizer.v7(), mistral.FAMILY, "text"),
    "v11": (lambda tmp: newer("v11", tmp), mistral.COMPACT, "text"),
    "v13-think": (lambda tmp: newer("v13", tmp), mistral.COMPACT, "think"),
}


def assistant_text(tokenizer: MistralTokenizer, extra: str) -> str:
    """What the model writes for one assistant turn, as mistral-common encodes it (after `[/INST]`, before `</s>`)."""
    content: Any = {
        "": None,
        "text": "Checking.",
        "think": [ThinkChunk(thinking="Two calls."), TextChunk(text="Checking.")],
    }[extra]
    calls = [
        MistralCall(id=f"call{i:05d}", function=FunctionCall(name=name, arguments=json.dumps(arguments)))
        for i, (name, arguments) in enumerate(CALLS)
    ]
    request = ChatCompletionRequest(
        messages=[
            UserMessage(content="Weather and time in Paris?"),
            AssistantMessage(content=content, tool_calls=calls),
            *[ToolMessage(content="ok", tool_call_id=call.id) for call in calls],
        ],
        tools=[
            MistralTool(function=Function(name=name, description=name, parameters={"type": "object"}))
            for name, _ in CALLS
        ],
    )
    tokens = tokenizer.encode_chat_completion(request).tokens
    text = tokenizer.instruct_tokenizer.tokenizer.decode(tokens, special_token_policy=SpecialTokenPolicy.KEEP)
    # sentencepiece pieces carry their spaces as "▁"
    text = text.replace("▁", " ")
    turn = text.partition("[/INST]")[2]
    assert "</s>" in turn, text
    return turn.partition("</s>")[0]


def read(family: Family, pieces: list[str]) -> tuple[str, str, list[tuple[str, Any]]]:
    splitter = splitter_for(family, Markers(think=family.think, family=family, tools=TOOLS))
    events: list[CompletionEvent] = []
    for piece in pieces:
        events += splitter.feed(piece)
    events += splitter.feed("", final=True)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    # A sentencepiece detokenizer drops the first piece's leading space; the text here kept it.
    answer = "".join(e.text for e in events if isinstance(e, TextDelta)).strip()
    return reasoning, answer, [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)]


@pytest.mark.parametrize("version", list(TOKENIZERS))
def test_splitter_reads_mistral_common_turns(version: str, tmp_path: Path) -> None:
    make, family, extra = TOKENIZERS[version]
    text = assistant_text(make(tmp_path), extra)
    assert text.count(mistral.START) == (len(CALLS) if family is mistral.COMPACT else 1), text
    expected = ("Two calls." if extra == "think" else "", "Checking." if extra else "", CALLS)
    assert read(family, [text]) == expected, text
    assert read(family, list(text)) == expected, text


def test_family_markers_are_mistral_special_tokens() -> None:
    names = {token.value for token in SpecialTokens}
    assert {mistral.START, mistral.ARGS, "[CALL_ID]"} <= names
    assert mistral.FAMILY.think is not None and set(mistral.FAMILY.think) <= names


def test_family_model_has_mistral_special_tokens() -> None:
    """Mistral-Small-3.1's tokenizer is v7: every special token the test model adds is one of its control tokens."""
    (case,) = [case for case in CASES if case.name == "mistral"]
    spm = MistralTokenizer.v7().instruct_tokenizer.tokenizer
    for token in (*case.special_tokens, case.bos, *case.eos):
        assert token is not None and spm.get_special_token(token) >= 0, token
    assert (spm.bos_id, spm.eos_id) == (spm.get_special_token("<s>"), spm.get_special_token("</s>"))
