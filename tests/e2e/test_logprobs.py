"""Logprobs in OpenAI's chat and legacy completions shapes, streamed and not."""

from __future__ import annotations

import math

import openai
import pytest

from tests import loopback
from tests.conftest import Server
from tests.e2e.conftest import stream_chunks

HELLO = [{"role": "user", "content": "Say something."}]


def test_chat_logprobs_match_greedy_choices(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=5,  # type: ignore[arg-type]
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert completion.usage is not None and len(entries) == completion.usage.completion_tokens == 12
    for entry in entries:
        assert entry.logprob <= 0
        # A token holding part of a character is named by its bytes, as OpenAI does.
        named = (
            entry.token.encode()
            if not entry.token.startswith("bytes:")
            else bytes.fromhex(entry.token[6:].replace("\\x", ""))
        )
        assert entry.bytes == list(named)
        top = entry.top_logprobs
        assert len(top) == 5
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        # Greedy decoding picks the most likely token: it is top-1, at the same logprob.
        assert top[0].token == entry.token and math.isclose(top[0].logprob, entry.logprob, abs_tol=1e-5)
        assert sum(math.exp(t.logprob) for t in top) <= 1 + 1e-4


def test_chat_without_top_logprobs_has_only_chosen(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="m", messages=HELLO, max_tokens=4, temperature=0, logprobs=True)  # type: ignore[arg-type]
    entries = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries is not None and len(entries) == 4 and all(e.top_logprobs == [] for e in entries)
    plain = client.chat.completions.create(model="m", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None


def test_streamed_chat_logprobs(server: Server) -> None:
    body = {
        "messages": HELLO,
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "stream_options": {"include_usage": True},
    }
    chunks = [c for c in stream_chunks(server, "/chat/completions", body) if isinstance(c, dict)]
    entries = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]  # type: ignore[index]
    assert len(entries) == chunks[-1]["usage"]["completion_tokens"] == 10  # type: ignore[index]
    assert all(len(e["top_logprobs"]) == 2 for e in entries)


def test_constrained_logprobs_only_name_allowed_tokens(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=5,
        logprobs=True,
        top_logprobs=20,  # type: ignore[arg-type]
        extra_body={"guided_choice": ["yes", "no"]},
    )
    entries = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries is not None
    first = entries[0]
    # Only the grammar's tokens were candidates: fewer than 20 alternatives, all finite.
    assert 1 <= len(first.top_logprobs) < 20
    assert all(math.isfinite(t.logprob) for t in first.top_logprobs)
    assert completion.choices[0].message.content in ("yes", "no")


def test_completions_legacy_shape(client: openai.OpenAI, server: Server) -> None:
    completion = client.completions.create(model="m", prompt="Hello", max_tokens=8, temperature=0, logprobs=3)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None and len(logprobs.tokens) == 8
    assert (
        logprobs.token_logprobs is not None and logprobs.top_logprobs is not None and logprobs.text_offset is not None
    )
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert len(top) <= 3 and math.isclose(max(top.values()), logprob, abs_tol=1e-5) and token in top
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
    body = {"prompt": "Hello", "max_tokens": 8, "temperature": 0, "logprobs": 3}
    chunks = [c for c in stream_chunks(server, "/completions", body) if isinstance(c, dict) and c["choices"]]
    streamed = [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]]  # type: ignore[index]
    assert streamed == logprobs.tokens


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": "yes"}, "logprobs"),
    ],
)
def test_bad_logprobs_fields(server: Server, body: dict[str, object], param: str) -> None:
    response = loopback.post(f"{server.v1}/chat/completions", json={"messages": HELLO, **body}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
