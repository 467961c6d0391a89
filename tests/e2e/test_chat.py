"""Chat completions through the real openai SDK against a real server."""

from __future__ import annotations

import openai
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server
from tests.e2e.conftest import stream_chunks

HELLO = [{"role": "user", "content": "Say hello."}]


def rendered_prompt_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text).ids)


def test_non_streaming_fields(client: openai.OpenAI, server: Server) -> None:
    completion = client.chat.completions.create(model="any", messages=HELLO, max_tokens=7, temperature=0)  # type: ignore[arg-type]
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.created > 0
    assert completion.model == loopback.get(f"{server.v1}/models").json()["data"][0]["id"]
    (choice,) = completion.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 7
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 0


def test_usage_counts_the_rendered_template(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Two "}, {"type": "text", "text": "parts."}]},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "Again."},
    ]
    completion = client.chat.completions.create(model="m", messages=messages, max_completion_tokens=3, temperature=0)  # type: ignore[arg-type]
    rendered = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTwo parts.<|im_end|>\n"
        "<|im_start|>assistant\nOk.<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    )
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens == rendered_prompt_tokens(tokenizer, rendered)
    assert usage.completion_tokens == 3
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_stream_matches_non_stream_under_greedy(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="m", messages=HELLO, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=24,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.id == chunks[0].id for chunk in chunks)
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == whole.choices[0].message.content
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stream_usage_chunk_is_last_with_empty_choices(server: Server) -> None:
    body = {"messages": HELLO, "max_tokens": 5, "temperature": 0, "stream_options": {"include_usage": True}}
    events = stream_chunks(server, "/chat/completions", body)
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk = events[:-1]
    assert isinstance(usage_chunk, dict)
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert isinstance(usage, dict)
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert all(isinstance(chunk, dict) and chunk["usage"] is None for chunk in chunks)


def test_stream_without_usage_option_has_no_usage_chunk(server: Server) -> None:
    events = stream_chunks(server, "/chat/completions", {"messages": HELLO, "max_tokens": 3})
    assert events[-1] == "[DONE]"
    assert all(isinstance(chunk, dict) and chunk["choices"] and "usage" not in chunk for chunk in events[:-1])


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    for max_tokens in (1, 2, 9):
        completion = client.chat.completions.create(model="m", messages=HELLO, max_tokens=max_tokens, temperature=0)  # type: ignore[arg-type]
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None and completion.usage.completion_tokens == max_tokens


def test_stop_string_cuts_text_across_token_boundaries(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    free = client.chat.completions.create(model="m", messages=HELLO, max_tokens=40, temperature=0)  # type: ignore[arg-type]
    text = free.choices[0].message.content
    assert text is not None and len(text) > 20
    # A stop string that starts inside one token and ends inside a later one.
    stop = text[12:17]
    expected = text[: text.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = client.chat.completions.create(
                model="m",
                messages=HELLO,
                max_tokens=40,
                temperature=0,
                stop=[stop],
                stream=True,  # type: ignore[arg-type]
            )
            pieces = list(chunks)
            got = "".join(chunk.choices[0].delta.content or "" for chunk in pieces)
            finish = pieces[-1].choices[0].finish_reason
        else:
            completion = client.chat.completions.create(
                model="m",
                messages=HELLO,
                max_tokens=40,
                temperature=0,
                stop=stop,  # type: ignore[arg-type]
            )
            got, finish = completion.choices[0].message.content, completion.choices[0].finish_reason
        assert got == expected
        assert finish == "stop"


def test_eos_token_finishes_with_stop(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    eos = tokenizer.token_to_id("<|im_end|>")
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=20,
        logit_bias={str(eos): 100},  # type: ignore[arg-type]
    )
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content == ""
    assert "<|im_end|>" not in (completion.choices[0].message.content or "")


def test_logit_bias_steers_every_token(client: openai.OpenAI, tokenizer: Tokenizer, plain_tokens: list[int]) -> None:
    token = plain_tokens[0]
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=6,
        logit_bias={str(token): 100},
        temperature=1.0,  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content == tokenizer.decode([token]) * 6


def test_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str | None:
        completion = client.chat.completions.create(
            model="m",
            messages=HELLO,
            max_tokens=24,
            temperature=1.5,
            seed=seed,  # type: ignore[arg-type]
        )
        return completion.choices[0].message.content

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first


def test_penalties_change_the_output(client: openai.OpenAI) -> None:
    def greedy(**extra: object) -> str | None:
        completion = client.chat.completions.create(
            model="m",
            messages=HELLO,
            max_tokens=48,
            temperature=0,
            **extra,  # type: ignore[arg-type]
        )
        return completion.choices[0].message.content

    base = greedy()
    assert greedy(frequency_penalty=2.0) != base
    assert greedy(presence_penalty=2.0) != base
    assert greedy(extra_body={"repetition_penalty": 1.8}) != base


def test_truncation_parameters_are_honoured(client: openai.OpenAI) -> None:
    def sample(seed: int, **extra: object) -> str | None:
        completion = client.chat.completions.create(
            model="m",
            messages=HELLO,
            max_tokens=16,
            temperature=2.0,
            seed=seed,
            **extra,  # type: ignore[arg-type]
        )
        return completion.choices[0].message.content

    greedy = client.chat.completions.create(model="m", messages=HELLO, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    # Keeping only the single most likely token is greedy decoding, whatever the temperature.
    assert sample(1, extra_body={"top_k": 1}) == greedy.choices[0].message.content
    assert sample(2, extra_body={"min_p": 1.0}) == greedy.choices[0].message.content
    assert sample(3, top_p=1e-9) == greedy.choices[0].message.content


def test_chat_template_kwargs_reach_the_template(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="m", messages=HELLO, max_tokens=1)  # type: ignore[arg-type]
    no_think = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},  # type: ignore[arg-type]
    )
    assert plain.usage is not None and no_think.usage is not None
    # enable_thinking=false appends an empty "<think>\n\n</think>\n\n" block.
    assert no_think.usage.prompt_tokens > plain.usage.prompt_tokens


def test_tool_role_message_is_accepted(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    completion = client.chat.completions.create(model="m", messages=messages, max_tokens=2, temperature=0)  # type: ignore[arg-type]
    assert completion.choices[0].finish_reason == "length"


def test_request_id_header_is_echoed_and_traced(server: Server) -> None:
    response = loopback.post(
        f"{server.v1}/chat/completions",
        json={"messages": HELLO, "max_tokens": 2},
        headers={"x-request-id": "trace-abc-123"},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "trace-abc-123"
    traced = [line for line in server.logs().splitlines() if "trace-abc-123" in line]
    for event in (
        "request.parse",
        "request.prepare",
        "request.queue",
        "request.prefill",
        "request.decode",
        "request.finish",
    ):
        assert any(event in line for line in traced), event
