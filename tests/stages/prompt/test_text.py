"""stages/prompt/text.py: raw prompts (text or token ids) → prompt tokens."""

from __future__ import annotations

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import ChatRequest, GenerationParams, Sampling, TextRequest
from pipeline.tracing import Timeline
from stages.messages import Parsed, PrepKind, PromptText, Reply
from stages.models.loading import ModelInfo, Tokenizer
from stages.prompt.text import TextJobs, encode_prompt

PARAMS = GenerationParams(max_tokens=4, sampling=Sampling())


@pytest.mark.parametrize("text", ["Once upon a time", "", "日本語 ☕", "<think>x</think>"])
def test_a_string_prompt_is_encoded_by_the_tokenizer(tokenizer: Tokenizer, model_info: ModelInfo, text: str) -> None:
    """A text prompt becomes exactly the tokenizer's encoding of it (no BOS for the demo model)."""
    tokens = encode_prompt(tokenizer, model_info.vocab_size, text)
    assert tokens == tokenizer.encode(text)
    assert tokenizer.decode(tokens) == text


@pytest.mark.parametrize(
    "ids",
    [pytest.param((0,), id="lowest"), pytest.param((1023,), id="highest"), pytest.param((5, 6, 5), id="repeats")],
)
def test_token_ids_inside_the_vocabulary_pass_through(
    tokenizer: Tokenizer, model_info: ModelInfo, ids: tuple[int, ...]
) -> None:
    """Token-id prompts are used as given, as a list, when every id is in 0..vocab_size-1."""
    assert model_info.vocab_size == 1024
    assert encode_prompt(tokenizer, model_info.vocab_size, ids) == list(ids)


@pytest.mark.parametrize(
    ("ids", "bad"),
    [
        pytest.param((1, 1024), 1024, id="vocab-size"),
        pytest.param((-1,), -1, id="negative"),
        pytest.param((10**9, 3), 10**9, id="huge"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_a_400(
    tokenizer: Tokenizer, model_info: ModelInfo, ids: tuple[int, ...], bad: int
) -> None:
    """An id the model has no embedding for fails the request (400, param prompt), naming the id and the range."""
    with pytest.raises(RequestError) as caught:
        encode_prompt(tokenizer, model_info.vocab_size, ids)
    error = caught.value
    assert (error.kind, error.param) == (ErrorKind.INVALID_REQUEST, "prompt")
    assert f"Token id {bad} is outside the vocabulary (0..1023)" == error.message


def parsed(request_id: str, generation: ChatRequest | TextRequest) -> Parsed:
    reply: Reply = Reply(request_id)
    return Parsed(request_id=request_id, request=generation, reply=reply, timeline=Timeline.start())


def test_text_jobs_turn_parsed_requests_into_tokenize_jobs(model_info: ModelInfo) -> None:
    """Text requests become TOKENIZE jobs; a bad id fails only in the job, a suffix without infill at once."""
    jobs = TextJobs(vocab_size=model_info.vocab_size)
    live = parsed("live", TextRequest(prompt="Once", params=PARAMS))
    bad_ids = parsed("bad", TextRequest(prompt=(5000,), params=PARAMS))
    made = [jobs.job(item, item.request) for item in (live, bad_ids) if isinstance(item.request, TextRequest)]
    assert [(job.request_id, job.kind) for job in made] == [("live", PrepKind.TOKENIZE), ("bad", PrepKind.TOKENIZE)]
    assert made[0].tokenize() == PromptText("Once", add_special_tokens=True)
    assert (made[0].reply, made[0].params, made[0].timeline) == (live.reply, PARAMS, live.timeline)
    with pytest.raises(RequestError):
        made[1].tokenize()
    suffixed = TextRequest(prompt="def f(", suffix="return 1", params=PARAMS)
    with pytest.raises(RequestError):
        jobs.job(parsed("fim", suffixed), suffixed)
