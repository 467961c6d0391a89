"""stages/stops.py: stop strings matched across arbitrary chunk boundaries.

Each case is fed split at every possible boundary (every two- and
three-piece split, and one character at a time). Whatever the split, the
emitted text is always a prefix of the text before the first stop, so no
part of a stop string is ever streamed, and at the end exactly that text
has been emitted, once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import combinations

import pytest

from stages.stops import StopMatcher, StopResult, hold_back


def splits(text: str) -> Iterator[list[str]]:
    """`text` whole, cut once at every index, cut twice at every pair, and char by char."""
    yield [text]
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    for first, second in combinations(range(len(text) + 1), 2):
        yield [text[:first], text[first:second], text[second:]]
    yield list(text)


def expected(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    hits = sorted((text.find(stop), stop) for stop in stops if stop in text)
    return (text[: hits[0][0]], hits[0][1]) if hits else (text, None)


def feed_all(stops: Sequence[str], pieces: list[str]) -> tuple[str, str | None]:
    """Feed pieces (the last with final=True) as the sink does; check the prefix invariant on the way."""
    matcher = StopMatcher(tuple(stops))
    text = "".join(pieces)
    allowed, _ = expected(text, stops)
    emitted = ""
    for index, piece in enumerate(pieces):
        result = matcher.feed(piece, final=index == len(pieces) - 1)
        emitted += result.text
        assert allowed.startswith(emitted), (pieces, emitted)
        if result.stop is not None:
            return emitted, result.stop
    return emitted, None


CASES = [
    pytest.param("Hello world. END and more", ("END",), id="one-stop-mid-text"),
    pytest.param("END at once", ("END",), id="stop-at-very-start"),
    pytest.param("ends with END", ("END",), id="stop-at-very-end"),
    pytest.param("no stop in here at all", ("END",), id="no-stop"),
    pytest.param("a tail that nearly EN", ("END",), id="partial-stop-at-end-is-flushed"),
    pytest.param("EEENEND!", ("END",), id="repeated-stop-prefixes"),
    pytest.param("first ### then \n\n later", ("\n\n", "###", "END"), id="several-stops-earliest-wins"),
    pytest.param("x\n\ny ### z", ("###", "\n\n"), id="several-stops-order-irrelevant"),
    pytest.param("zab abx abcd", ("abcd", "abce", "abx"), id="overlapping-prefixes"),
    pytest.param("abcabcabd!", ("abcabd",), id="self-overlapping-stop"),
    pytest.param("twice: STOP and STOP", ("STOP",), id="first-occurrence"),
    pytest.param("日本語のテキスト。停止ここ", ("停止",), id="non-ascii"),
    pytest.param("<think>x</think>answer", ("</think>",), id="tag-stop"),
    pytest.param("", ("END",), id="empty-text"),
]


@pytest.mark.parametrize(("text", "stops"), CASES)
def test_every_split_emits_exactly_the_text_before_the_first_stop(text: str, stops: tuple[str, ...]) -> None:
    """However the text is chunked, output is the text before the first stop (once), and that stop is reported."""
    # The cases avoid a stop inside another stop, where "first" depends on the chunking.
    assert not any(a != b and a in b for a in stops for b in stops)
    want = expected(text, stops)
    for pieces in splits(text):
        assert feed_all(stops, pieces) == want, pieces


def test_ordinary_text_is_not_delayed() -> None:
    """Text that cannot begin a stop string is emitted as soon as it is fed."""
    matcher = StopMatcher(("END",))
    assert matcher.feed("hello ") == StopResult(text="hello ")
    assert matcher.feed("there") == StopResult(text="there")


def test_only_a_possible_stop_prefix_is_held_back() -> None:
    """The longest suffix that could begin a stop is held; the rest goes out now."""
    matcher = StopMatcher(("END", "xyz"))
    assert matcher.feed("say E") == StopResult(text="say ")
    assert matcher.feed("N") == StopResult(text="")
    assert matcher.feed("o more") == StopResult(text="ENo more")
    assert matcher.feed("xy") == StopResult(text="")
    assert matcher.feed("", final=True) == StopResult(text="xy")


def test_final_flush_releases_held_text() -> None:
    """With final=True nothing is held back, so a generation's last characters are never lost."""
    matcher = StopMatcher(("END",))
    assert matcher.feed("it is EN") == StopResult(text="it is ")
    assert matcher.feed("", final=True) == StopResult(text="EN")


def test_text_after_the_stop_is_discarded() -> None:
    """The stop and everything after it in the same chunk are dropped."""
    assert StopMatcher(("\n",)).feed("line one\nline two", final=True) == StopResult(text="line one", stop="\n")


def test_no_stops_passes_text_through() -> None:
    """A request without stop strings streams its text unchanged, holding nothing."""
    matcher = StopMatcher(())
    assert [matcher.feed(piece).text for piece in ("a", "", "bc")] == ["a", "", "bc"]


@pytest.mark.parametrize(
    ("buffer", "final", "split"),
    [
        ("answer <|en", False, ("answer ", "<|en")),
        ("answer <|en", True, ("answer <|en", "")),
        ("answer <", False, ("answer ", "<")),
        ("answer <|x", False, ("answer <|x", "")),
        ("<|end", False, ("", "<|end")),
        ("", False, ("", "")),
    ],
)
def test_hold_back_keeps_only_an_end_that_could_grow_into_a_needle(
    buffer: str, final: bool, split: tuple[str, str]
) -> None:
    """The two parts always rejoin into the buffer; with `final` nothing is held."""
    assert hold_back(buffer, ("<|end|>", "<|call|>"), final=final) == split
