"""Gemma 4's object notation (`stages/families/gemma4_notation.py`) read as JSON, whole and as it
streams, and its calls and reasoning split out of text (`gemma4.py` through the markup splitter)."""

from __future__ import annotations

import json

import pytest

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta
from stages.families import gemma4
from stages.families.gemma4_notation import scan_notation
from stages.reply.markup import Markers, Section, splitter_for

Q = '<|"|>'


@pytest.mark.parametrize(
    ("notation", "value"),
    [
        (f"{{a:{Q}x, y{Q},n:-1.5e-05,ok:true,no:None,z:null}}", {"a": "x, y", "n": -1.5e-05, "ok": True, "no": None}),
        (f"{{ key with space : [1, 2, {{inner:{Q}}}{Q}}}] }}", {"key with space": [1, 2, {"inner": "}"}]}),
        (f'{{{Q}quoted key{Q}:"json string",b:{Q}a "q" \\ {Q}}}', {"quoted key": "json string", "b": 'a "q" \\ '}),
        ("{}", {}),
        (f"{{s:{Q}{Q},e:[],o:{{}}}}", {"s": "", "e": [], "o": {}}),
    ],
)
def test_notation_reads_as_json(notation: str, value: dict[str, object]) -> None:
    scan = scan_notation(notation)
    assert scan.end == len(notation) and not scan.broken
    assert json.loads(scan.text) == value | ({"z": None} if "z:" in notation else {})


@pytest.mark.parametrize("notation", ["{a:1,}", "{a 1}", "{a:inf}", "{a:1.2.3}", "{a,b:1}", f"{{a:{Q}x{Q}{Q}y{Q}}}"])
def test_broken_notation_is_broken(notation: str) -> None:
    assert scan_notation(notation).broken


def test_every_prefix_shows_a_prefix_of_the_whole() -> None:
    """What a cut source shows, the whole starts with: so a streamed piece is never taken back,
    and a closing quote half written is never shown as text."""
    notation = f"{{title:{Q}a<b {Q},tags:[{Q}x{Q},{Q}<|{Q}],days:-12,done:false,owner:{{name:{Q}Zoë{Q}}}}}"
    whole = scan_notation(notation).text
    assert json.loads(whole) == {
        "title": "a<b ",
        "tags": ["x", "<|"],
        "days": -12,
        "done": False,
        "owner": {"name": "Zoë"},
    }
    for cut in range(len(notation)):
        shown = scan_notation(notation[:cut])
        assert whole.startswith(shown.text) and not shown.broken, (cut, shown)
        # Half a closing quote would read `<|\"` in JSON.
        assert '<|\\"' not in shown.text


@pytest.mark.parametrize(
    "body",
    ["call:f", "call:f{a:1", "call:f{a:1}x", "call:bad name{}", "f{}", "call:f{a:1}{b:2}", f"call:f{{a:{Q}x}}"],
)
def test_a_body_that_is_no_whole_call_does_not_parse(body: str) -> None:
    assert gemma4.parse(gemma4.START, body, ()) is None


def test_a_whole_call_parses_with_its_name_as_written() -> None:
    assert gemma4.parse(gemma4.START, f" call:get-weather.now{{city:{Q}Oslo{Q}}} ", ()) == [
        ("get-weather.now", {"city": "Oslo"})
    ]


def split(text: str, pieces: int = 1, *, cut: bool = False) -> list[CompletionEvent]:
    """`text` through the family's splitter in pieces of `pieces` characters."""
    family = gemma4.FAMILY
    splitter = splitter_for(family, Markers(think=family.think, family=family), Section.ANSWER)
    chunks = [text[at : at + pieces] for at in range(0, len(text), pieces)] or [""]
    events: list[CompletionEvent] = []
    for chunk in chunks[:-1]:
        events += splitter.feed(chunk)
    return events + splitter.feed(chunks[-1], final=True, cut=cut)


@pytest.mark.parametrize("pieces", [1, 3, 1000])
def test_an_end_marker_or_odd_quote_inside_a_string_is_text(pieces: int) -> None:
    """A `"` has no meaning inside Gemma's strings (JSON's quote counting would keep the call open),
    and `<tool_call|>` there is text; the whitespace beside the call is the model's."""
    text = f'Before <|tool_call>call:get-weather.now{{city:{Q}He said "hi <tool_call|> \\{Q}}}<tool_call|> after'
    events = split(text, pieces)
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get-weather.now", {"city": 'He said "hi <tool_call|> \\'})
    ]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Before  after"


def test_arguments_stream_as_json_pieces_that_join_to_the_call() -> None:
    text = f"<|tool_call>call:plan{{days:3,tags:[{Q}a{Q},{Q}b{Q}],title:{Q}Trip to Oslo{Q}}}<tool_call|>"
    events = split(text)
    pieces = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    (call,) = [e for e in events if isinstance(e, ToolCall)]
    assert pieces == call.arguments and len([e for e in events if isinstance(e, ToolCallDelta)]) > 5
    assert json.loads(call.arguments) == {"days": 3, "tags": ["a", "b"], "title": "Trip to Oslo"}


def test_a_call_cut_at_max_tokens_ends_with_its_arguments_so_far() -> None:
    (call,) = [e for e in split(f"<|tool_call>call:plan{{title:{Q}Tri", 2, cut=True) if isinstance(e, ToolCall)]
    assert (call.name, call.arguments) == ("plan", '{"title": "Tri')


def test_reasoning_is_the_thought_channel() -> None:
    events = split("<|channel>thought\nweigh it\n<channel|>The answer.", 2)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert (reasoning, "".join(e.text for e in events if isinstance(e, TextDelta))) == ("weigh it", "The answer.")
