"""vLLM's output-changing extension fields through the openai SDK: each one changes the output as vLLM specifies."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from tokenizers import Tokenizer

from tests.conftest import Server
from tests.e2e.conftest import stream_chunks

HELLO = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def eos_first(tokenizer: Tokenizer) -> dict[str, int]:
    """A logit bias under which greedy decoding ends on an EOS at once."""
    return {str(tokenizer.token_to_id(token)): 100 for token in ("<|im_end|>", "<|endoftext|>")}


def chat(client: openai.OpenAI, **extra: Any) -> Any:
    bias = extra.pop("logit_bias", None)
    return client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=8,
        temperature=0,
        logit_bias=bias,
        extra_body=extra,  # type: ignore[arg-type]
    )


def test_ignore_eos_runs_past_the_eos_to_max_tokens(client: openai.OpenAI, eos_first: dict[str, int]) -> None:
    ended = chat(client, logit_bias=eos_first)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens == 1
    ignored = chat(client, logit_bias=eos_first, ignore_eos=True)
    assert ignored.choices[0].finish_reason == "length" and ignored.usage.completion_tokens == 8
    # The EOS tokens it wrote are not text, as with vLLM's default skip_special_tokens.
    assert "<|im_end|>" not in (ignored.choices[0].message.content or "")


def test_min_tokens_holds_off_the_eos(
    client: openai.OpenAI, eos_first: dict[str, int], plain_tokens: list[int]
) -> None:
    held = chat(client, logit_bias=eos_first, min_tokens=5)
    # Five tokens that cannot be EOS, then the EOS the bias asks for.
    assert held.choices[0].finish_reason == "stop" and held.usage.completion_tokens == 6
    assert held.choices[0].message.content


def test_min_tokens_holds_off_stop_strings_too(
    client: openai.OpenAI, plain_tokens: list[int], tokenizer: Tokenizer
) -> None:
    word = tokenizer.decode([plain_tokens[0]])
    bias = {str(plain_tokens[0]): 100}
    stopped = chat(client, logit_bias=bias, stop=[word])
    assert stopped.choices[0].message.content == ""
    held = chat(client, logit_bias=bias, stop=[word], min_tokens=3)
    assert held.choices[0].message.content == word * 3 and held.choices[0].finish_reason == "stop"


def test_stop_token_ids_end_the_completion_without_their_text(
    server: Server, plain_tokens: list[int], tokenizer: Tokenizer
) -> None:
    client = server.client()
    token = plain_tokens[1]
    bias = {str(token): 100}
    free = chat(client, logit_bias=bias)
    assert free.choices[0].message.content == tokenizer.decode([token]) * 8
    stopped = chat(client, logit_bias=bias, stop_token_ids=[token])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == "" and stopped.usage.completion_tokens == 1
    # The same in /v1/completions, streamed.
    body = {"prompt": "Once", "max_tokens": 8, "temperature": 0, "logit_bias": bias, "stop_token_ids": [token]}
    chunks = [c for c in stream_chunks(server, "/completions", body) if isinstance(c, dict)]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == ""  # type: ignore[index]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]


def test_stop_token_ids_outside_the_vocabulary_are_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, stop_token_ids=[10**9])
    assert caught.value.body["param"] == "stop_token_ids"  # type: ignore[index]


def test_typical_p_narrows_sampling(client: openai.OpenAI, no_eos: dict[str, int]) -> None:
    def sample(seed: int, **extra: Any) -> str:
        completion = client.completions.create(
            model="m",
            prompt="Once upon a time",
            max_tokens=12,
            temperature=1.0,
            seed=seed,
            logit_bias=no_eos,
            extra_body=extra,  # type: ignore[arg-type]
        )
        return completion.choices[0].text

    # With almost no mass only the most typical token stays each step: the seed no longer matters.
    assert sample(1, typical_p=1e-6) == sample(2, typical_p=1e-6)
    assert sample(1) != sample(2)
    # vLLM-style fields are read on Completions too.
    assert sample(1, typical_p=1e-6) != sample(1)


@pytest.mark.parametrize(
    ("field", "value"),
    [("chat_template", "{{ messages }}"), ("prompt_logprobs", 1), ("draft_model", "small"), ("use_beam_search", True)],
)
def test_refused_extensions_are_400s_naming_them(client: openai.OpenAI, field: str, value: object) -> None:
    for call in (
        lambda: chat(client, **{field: value}),
        lambda: client.completions.create(model="m", prompt="x", max_tokens=2, extra_body={field: value}),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        assert caught.value.body["param"] == field and caught.value.body["code"] == "unsupported_parameter"  # type: ignore[index]


def test_min_tokens_yields_to_a_grammar_that_has_ended(client: openai.OpenAI) -> None:
    # The grammar's output is shorter than min_tokens: at its end only EOS is allowed, and it ends the row.
    reply = chat(client, min_tokens=50, guided_choice=["yes", "no"])
    assert reply.choices[0].message.content in ("yes", "no") and reply.choices[0].finish_reason == "stop"
