"""The markup splitter: reasoning and tool calls out of text split anywhere."""

from __future__ import annotations

import json

import pytest

from pipeline.events import CompletionEvent, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta, ToolCallStart
from pipeline.requests import Tool
from stages.families import hermes
from stages.models.loading import Tokenizer
from stages.reply.markup import Markers, MarkupSplitter, Section

MARKERS = Markers(think=("<think>", "</think>"), family=hermes.FAMILY)


def merged(events: list[CompletionEvent]) -> list[tuple[str, str]]:
    """(kind, content) runs: text and reasoning joined, each call as name + arguments.

    A call's streamed pieces join to its arguments, and its start (if sent) names it first.
    """
    runs: list[tuple[str, str]] = []
    started: dict[int, tuple[str, str]] = {}
    for event in events:
        if isinstance(event, ToolCallStart):
            assert event.index not in started
            started[event.index] = (event.name, "")
            continue
        if isinstance(event, ToolCallDelta):
            name, sent = started[event.index]
            started[event.index] = (name, sent + event.arguments)
            continue
        if isinstance(event, ToolCall):
            assert started.pop(event.index, (event.name, event.arguments)) == (event.name, event.arguments)
            runs.append(("call", f"{event.name}{event.arguments}"))
            continue
        assert isinstance(event, (TextDelta, ReasoningDelta))
        kind = "text" if isinstance(event, TextDelta) else "reasoning"
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + event.text)
        else:
            runs.append((kind, event.text))
    return runs


CASES = [
    pytest.param(
        "<think>\nplan it\n</think>\n\nThe answer.",
        Section.ANSWER,
        [("reasoning", "plan it"), ("text", "The answer.")],
        id="think-then-answer",
    ),
    pytest.param(
        "still thinking</think>done",
        Section.REASONING,
        [("reasoning", "still thinking"), ("text", "done")],
        id="opened-by-template",
    ),
    pytest.param(
        'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n',
        Section.ANSWER,
        [("text", "Let me check."), ("call", 'f{"x": 1}')],
        id="text-then-call",
    ),
    pytest.param(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": "{\\"k\\": \\"v\\"}"}</tool_call>',
        Section.ANSWER,
        [("call", "a{}"), ("call", 'b{"k": "v"}')],
        id="two-calls-string-arguments",
    ),
    pytest.param(
        "<tool_call>not json</tool_call> after",
        Section.ANSWER,
        [("text", "<tool_call>not json</tool_call>after")],
        id="unparseable-call-kept-as-text",
    ),
    pytest.param(
        'Calling.<tool_call>{"name": "f", "arguments": {"x": "cut by max_tok',
        Section.ANSWER,
        [("text", "Calling.")],
        id="call-the-output-ends-inside-is-dropped",
    ),
    pytest.param(
        '<tool_call>{"name": "f", "arguments": {"x": "a </tool_call> b"}}</tool_call>',
        Section.ANSWER,
        [("call", 'f{"x": "a </tool_call> b"}')],
        id="closer-inside-a-json-string",
    ),
    pytest.param(
        "a < b and <thinking> is not a marker",
        Section.ANSWER,
        [("text", "a < b and <thinking> is not a marker")],
        id="near-misses",
    ),
    pytest.param("x <tool_cal", Section.ANSWER, [("text", "x <tool_cal")], id="partial-marker-at-end-is-text"),
    pytest.param(
        "<think>cut short by max_tokens",
        Section.ANSWER,
        [("reasoning", "cut short by max_tokens")],
        id="unclosed-think",
    ),
]


@pytest.mark.parametrize(("text", "section", "expected"), CASES)
def test_every_split_gives_the_same_events(text: str, section: Section, expected: list[tuple[str, str]]) -> None:
    encoded = text.encode()
    for cut in range(len(encoded) + 1):
        head, tail = encoded[:cut].decode(errors="ignore"), encoded[cut:].decode(errors="ignore")
        if head + tail != text:
            continue  # the cut fell inside a character; the detokenizer never splits there
        splitter = MarkupSplitter(MARKERS, section=section)
        events = splitter.feed(head) + splitter.feed(tail, final=True)
        assert merged(events) == expected, cut
        assert not any(
            isinstance(e, (TextDelta, ReasoningDelta)) and "<think>" in e.text
            for e in events
            if expected[0][0] != "text"
        )


def test_character_by_character_streaming() -> None:
    text = '<think>why</think>Answer <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    splitter = MarkupSplitter(MARKERS)
    events: list[CompletionEvent] = []
    for char in text:
        step = splitter.feed(char)
        # Nothing of a marker is ever emitted as text while it streams.
        assert all("<" not in e.text for e in step if isinstance(e, (TextDelta, ReasoningDelta)))
        events.extend(step)
    events.extend(splitter.feed("", final=True))
    assert merged(events) == [("reasoning", "why"), ("text", "Answer"), ("call", "f{}")]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [c.index for c in calls] == [0] and calls[0].id.startswith("call_")
    assert json.loads(calls[0].arguments) == {}
    assert splitter.tool_calls == 1


def test_no_markers_is_plain_text() -> None:
    splitter = MarkupSplitter(Markers())
    text = "  <think> kept </tool_call>  "
    assert merged(splitter.feed(text[:7]) + splitter.feed(text[7:], final=True)) == [("text", text)]


def test_no_markers_gives_each_piece_at_once_whitespace_too() -> None:
    """With no marker to follow it, whitespace is not layout: the plain splitter gives each piece's text as it comes
    (a completion opening with "\n\n" gave its first text two steps late when it was held), and the whole text is
    what the full loop gives for text that holds none of its markers."""
    pieces = ["\n", "\n", "Hello", " ", "world ", "\n", "", " again", "  end \t"]
    plain, marked = MarkupSplitter(Markers()), MarkupSplitter(Markers(think=("<think>", "</think>")))
    plain_events, marked_events = [], []
    for index, piece in enumerate(pieces):
        final = index == len(pieces) - 1
        given = plain.feed(piece, final=final)
        assert given == ([TextDelta(text=piece)] if piece else []), piece
        plain_events += given
        marked_events += marked.feed(piece, final=final)
    # The full loop holds "\n\n" back until "Hello" shows that no marker follows it.
    assert marked_events[0] == TextDelta(text="\n\nHello")
    assert merged(plain_events) == merged(marked_events) == [("text", "".join(pieces))]


@pytest.mark.parametrize("per_step", [1, 2, 3])
def test_real_tokens_through_the_detokenizer(tokenizer: Tokenizer, per_step: int) -> None:
    """The path the sink takes: model tokens → mlx-lm's streaming detokenizer → splitter."""
    from stages.families import choose_family
    from stages.reply.markup import markers_for

    text = (
        "<think>\nweigh é options\n</think>\n\n"
        'Calling: <tool_call>\n{"name": "f", "arguments": {"q": "ü"}}\n</tool_call>'
    )
    tokens = tokenizer.encode(text, add_special_tokens=False)
    markers = markers_for(choose_family(tokenizer), (Tool(name="f"),), parse_tools=True)
    assert (
        markers.think is not None and markers.family is not None and markers.family.name == "mlx-lm"
    )  # inferred, not hard-coded
    splitter, detokenizer = MarkupSplitter(markers), tokenizer.detokenizer
    events: list[CompletionEvent] = []
    for start in range(0, len(tokens), per_step):
        for token in tokens[start : start + per_step]:
            detokenizer.add_token(token)
        final = start + per_step >= len(tokens)
        if final:
            detokenizer.finalize()
        events.extend(splitter.feed(detokenizer.last_segment, final=final))
    assert merged(events) == [("reasoning", "weigh é options"), ("text", "Calling:"), ("call", 'f{"q": "ü"}')]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<|tool_call|>[{"name": "f", "arguments": {"q": 1}}]<|/tool_call|>', [("call", 'f{"q": 1}')]),
        (
            'functools[{"name": "f", "arguments": {"q": 1}}, {"name": "g", "arguments": {}}]',
            [("call", 'f{"q": 1}'), ("call", "g{}")],
        ),
        ("See functools[ in the docs.", [("text", "See functools[ in the docs.")]),
    ],
    ids=["tokens", "functools-text", "not-a-call"],
)
def test_phi4_mini_call_forms(text: str, expected: list[tuple[str, str]]) -> None:
    """Phi-4-mini's call list between its tokens, and the `functools[…]` text form it also writes (as the whole
    answer only)."""
    from stages.families import phi4

    for cut in range(len(text) + 1):
        splitter = MarkupSplitter(Markers(think=phi4.FAMILY.think, family=phi4.FAMILY))
        events = splitter.feed(text[:cut]) + splitter.feed(text[cut:], final=True)
        assert merged(events) == expected, cut


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'Calling.<tool_call>{"name": "f", "arguments": {"x": "cut by max_tok',
            [("text", "Calling."), ("call", 'f{"x": "cut by max_tok')],
        ),
        ('Calling.<tool_call>{"name": "get_w', [("text", "Calling.")]),
    ],
    ids=["keeps-what-was-written", "before-its-name-nothing"],
)
def test_call_cut_by_max_tokens(text: str, expected: list[tuple[str, str]]) -> None:
    """Cut off at max tokens (not ended by the model), a call whose name is whole is a call with the arguments so
    far."""
    for cut in range(len(text) + 1):
        splitter = MarkupSplitter(MARKERS)
        assert merged(splitter.feed(text[:cut]) + splitter.feed(text[cut:], final=True, cut=True)) == expected, cut
