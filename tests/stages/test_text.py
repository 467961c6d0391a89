"""stages/prompt/text.py: raw prompts (text or token ids) → prompt tokens."""

from __future__ import annotations

import anyio
import pytest

from pipeline.channels import Channel, open_channel
from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import ChatRequest, GenerationParams, Message, Role, Sampling, TextRequest
from pipeline.tracing import Timeline
from stages.messages import Parsed, PrepareJob, PrepKind, PromptText, Reply
from stages.models.loading import ModelInfo, Tokenizer
from stages.prompt.text import TextStage, encode_prompt

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
def test_token_ids_inside_the_vocabulary_pass_through(tokenizer: Tokenizer, model_info: ModelInfo, ids: tuple[int, ...]) -> None:
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


async def test_text_stage_turns_parsed_requests_into_tokenize_jobs(tokenizer: Tokenizer, model_info: ModelInfo) -> None:
    """Text requests become TOKENIZE jobs; closed or chat requests are dropped; a bad id fails only in the job."""
    inbox: Channel[Parsed] = open_channel(4, name="text")
    out: Channel[PrepareJob] = open_channel(4, name="prepare")
    live = parsed("live", TextRequest(prompt="Once", params=PARAMS))
    bad_ids = parsed("bad", TextRequest(prompt=(5000,), params=PARAMS))
    gone = parsed("gone", TextRequest(prompt="x", params=PARAMS))
    gone.reply.close()
    chat = parsed("chat", ChatRequest(messages=(Message(role=Role.USER, content="x"),), params=PARAMS))
    stage = TextStage(inbox=inbox.receive, out=out.send, tokenizer=tokenizer, vocab_size=model_info.vocab_size)
    with out.receive, anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(stage.run)
            async with inbox.send:
                for item in (gone, live, chat, bad_ids):
                    await inbox.send.send(item)
        jobs = [job async for job in out.receive]
    assert [(job.request_id, job.kind) for job in jobs] == [("live", PrepKind.TOKENIZE), ("bad", PrepKind.TOKENIZE)]
    assert jobs[0].tokenize() == PromptText("Once", add_special_tokens=True)
    assert (jobs[0].reply, jobs[0].params) == (live.reply, PARAMS)
    with pytest.raises(RequestError):
        jobs[1].tokenize()
