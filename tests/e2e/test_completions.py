"""Text completions through the real openai SDK against a real server."""

from __future__ import annotations

import openai
from tokenizers import Tokenizer

from tests.conftest import Server
from tests.e2e.conftest import stream_chunks


def test_non_streaming_fields(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    completion = client.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    (choice,) = completion.choices
    assert choice.index == 0 and choice.finish_reason == "length"
    assert isinstance(choice.text, str) and choice.text
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(tokenizer.encode("Once upon a time").ids)
    assert completion.usage.completion_tokens == 6
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 6


def test_default_max_tokens_is_sixteen(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="m", prompt="Hello", temperature=0)
    assert completion.usage is not None and completion.usage.completion_tokens == 16


def test_token_id_prompt_counts_exactly(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("The server reads a request").ids
    by_ids = client.completions.create(model="m", prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(model="m", prompt="The server reads a request", max_tokens=8, temperature=0)
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_stream_text_and_usage(server: Server, client: openai.OpenAI) -> None:
    body = {"prompt": "Numbers", "max_tokens": 10, "temperature": 0, "stream_options": {"include_usage": True}}
    events = stream_chunks(server, "/completions", body)
    assert events[-1] == "[DONE]"
    chunks = [event for event in events[:-1] if isinstance(event, dict)]
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    streamed = "".join(str(chunk["choices"][0]["text"]) for chunk in chunks if chunk["choices"])  # type: ignore[index]
    whole = client.completions.create(model="m", prompt="Numbers", max_tokens=10, temperature=0)
    assert streamed == whole.choices[0].text
    finishes = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]]  # type: ignore[index]
    assert finishes[-1] == "length" and finishes.count("length") == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10  # type: ignore[index]


def test_stop_list_first_match_wins(client: openai.OpenAI) -> None:
    free = client.completions.create(model="m", prompt="Hello", max_tokens=40, temperature=0).choices[0].text
    early, late = free[20:24], free[8:11]
    completion = client.completions.create(model="m", prompt="Hello", max_tokens=40, temperature=0, stop=[early, late])
    assert completion.choices[0].text == free[: min(free.index(early), free.index(late))]
    assert completion.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def sample() -> str:
        return (
            client.completions.create(model="m", prompt="Hi", max_tokens=20, temperature=1.0, seed=99).choices[0].text
        )

    assert sample() == sample()
