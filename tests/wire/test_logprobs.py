"""wire/logprobs.py: `Logprobs` events → OpenAI's chat and legacy completions logprobs shapes.

Both shapes are None when no `Logprobs` event came (the request did not
ask); other events are ignored. The legacy shape's `text_offset` runs on
across calls, so a stream's chunks continue where the last one ended.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.events import CompletionEvent, Logprobs, ReasoningDelta, TextDelta, TokenLogprob, ToolCall
from wire.logprobs import chat_logprobs, legacy_logprobs


def scored(token: str, logprob: float) -> TokenLogprob:
    return TokenLogprob(token=token, bytes=tuple(token.encode()), logprob=logprob)


HE, LLO, WORLD = scored("He", -0.5), scored("llo", -0.25), scored(" wörld", -1.0)
ALT_HA, ALT_HI = scored("Ha", -1.5), scored("Hi", -2.0)
STEP_1 = Logprobs(chosen=(HE,), top=((HE, ALT_HA, ALT_HI),))
STEP_2 = Logprobs(chosen=(LLO, WORLD), top=((LLO,), ()))
OTHERS: list[CompletionEvent] = [
    TextDelta(text="Hello"),
    ReasoningDelta(text="hm"),
    ToolCall(index=0, id="call_1", name="f", arguments="{}"),
]


def entry(token: TokenLogprob) -> dict[str, Any]:
    return {"token": token.token, "logprob": token.logprob, "bytes": list(token.bytes)}


@pytest.mark.parametrize("events", [[], OTHERS], ids=["no-events", "no-logprobs-events"])
def test_no_logprobs_events_means_none(events: list[CompletionEvent]) -> None:
    """A request that did not ask for logprobs gets `logprobs: null`, and the offset does not move."""
    assert chat_logprobs(events) is None
    assert legacy_logprobs(events, 7) == (None, 7)


CHAT = [
    pytest.param(
        [STEP_1],
        [{**entry(HE), "top_logprobs": [entry(HE), entry(ALT_HA), entry(ALT_HI)]}],
        id="one-token-with-alternatives",
    ),
    pytest.param(
        [TextDelta(text="He"), STEP_1, TextDelta(text="llo wörld"), STEP_2],
        [
            {**entry(HE), "top_logprobs": [entry(HE), entry(ALT_HA), entry(ALT_HI)]},
            {**entry(LLO), "top_logprobs": [entry(LLO)]},
            {**entry(WORLD), "top_logprobs": []},
        ],
        id="steps-in-order-other-events-ignored",
    ),
]


@pytest.mark.parametrize(("events", "content"), CHAT)
def test_chat_logprobs(events: list[CompletionEvent], content: list[Any]) -> None:
    """Chat's shape: one entry per token with its UTF-8 bytes and its alternatives; refusal null."""
    assert chat_logprobs(events) == {"content": content, "refusal": None}


def test_chat_bytes_are_utf8_of_the_token() -> None:
    """`bytes` lists the token's UTF-8 bytes, so a client can rebuild split characters."""
    body = chat_logprobs([Logprobs(chosen=(WORLD,), top=((),))])
    assert body is not None
    assert body["content"] == [
        {"token": " wörld", "logprob": -1.0, "bytes": [32, 119, 195, 182, 114, 108, 100], "top_logprobs": []}
    ]


def test_legacy_logprobs_shape() -> None:
    """The completions shape: parallel lists, alternatives as {token: logprob}, offsets in characters."""
    body, offset = legacy_logprobs([STEP_1, TextDelta(text="x"), STEP_2], 0)
    assert body == {
        "tokens": ["He", "llo", " wörld"],
        "token_logprobs": [-0.5, -0.25, -1.0],
        "top_logprobs": [{"He": -0.5, "Ha": -1.5, "Hi": -2.0}, {"llo": -0.25}, {}],
        "text_offset": [0, 2, 5],
    }
    assert offset == 11


def test_legacy_text_offset_runs_on_across_calls() -> None:
    """Each streamed chunk's offsets start where the previous chunk's text ended."""
    first, offset = legacy_logprobs([STEP_1], 3)
    second, end = legacy_logprobs([TextDelta(text="no logprobs here")], offset)
    third, final = legacy_logprobs([STEP_2], end)
    assert first is not None and third is not None
    assert (first["text_offset"], offset) == ([3], 5)
    assert (second, end) == (None, 5)
    assert (third["text_offset"], final) == ([5, 8], 14)
