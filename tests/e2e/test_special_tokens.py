"""Special tokens stay out of text unless asked (`skip_special_tokens`, true by default as in vLLM), in
bodies and stream deltas. A logit bias makes the model write `<|im_start|>` (special in the tiny model's
tokenizer.json) at every step, so the test holds whatever the random weights would pick."""

from __future__ import annotations

import openai
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server
from tests.e2e.conftest import stream_chunks

pytestmark = pytest.mark.slow

SPECIAL = "<|im_start|>"
HELLO = [{"role": "user", "content": "Hello there"}]


def forced(tokenizer: Tokenizer) -> dict[str, int]:
    return {str(tokenizer.token_to_id(SPECIAL)): 100}


@pytest.mark.parametrize("seed", [23, 24])
def test_chat_body_leaves_special_tokens_out_by_default(client: openai.OpenAI, tokenizer: Tokenizer, seed: int) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=6,
        seed=seed,
        logit_bias=forced(tokenizer),  # type: ignore[arg-type]
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 6
    assert SPECIAL not in (completion.choices[0].message.content or "")


def test_chat_keeps_them_when_asked(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=3,
        logit_bias=forced(tokenizer),  # type: ignore[arg-type]
        extra_body={"skip_special_tokens": False},
    )
    assert completion.choices[0].message.content == SPECIAL * 3


@pytest.mark.parametrize("skip", [None, True, False])
def test_chat_stream_deltas(server: Server, tokenizer: Tokenizer, skip: bool | None) -> None:
    body: dict[str, object] = {"messages": HELLO, "max_tokens": 4, "logit_bias": forced(tokenizer)}
    if skip is not None:
        body["skip_special_tokens"] = skip
    chunks = [chunk for chunk in stream_chunks(server, "/chat/completions", body) if isinstance(chunk, dict)]
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])  # type: ignore[index]
    assert text == ("" if skip is not False else SPECIAL * 4)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_leave_them_out(server: Server, tokenizer: Tokenizer, stream: bool) -> None:
    body = {"model": "m", "prompt": "Hello", "max_tokens": 4, "logit_bias": forced(tokenizer)}
    if stream:
        chunks = [chunk for chunk in stream_chunks(server, "/completions", body) if isinstance(chunk, dict)]
        text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])  # type: ignore[index]
    else:
        text = loopback.post(f"{server.v1}/completions", json=body, timeout=60).json()["choices"][0]["text"]
    assert text == ""
    kept = loopback.post(
        f"{server.v1}/completions", json={**body, "stream": False, "skip_special_tokens": False}, timeout=60
    )
    assert kept.json()["choices"][0]["text"] == SPECIAL * 4


def test_messages_and_responses_skip_them_by_default() -> None:
    """Neither API has the field; the default holds (the sink is shared, so the chat tests above cover the text)."""
    from wire.anthropic_requests import decode_messages
    from wire.responses_requests import decode_responses, to_chat

    messages = decode_messages({"model": "m", "messages": HELLO, "max_tokens": 4})  # type: ignore[dict-item]
    responses = to_chat(decode_responses({"model": "m", "input": "Hello"}), (), None)
    assert messages.params.skip_special_tokens and responses.params.skip_special_tokens
