"""stages/prompt/prepare.py: tokenizing off the event loop, and the context-window checks.

The stage is driven through its own streams with real tokenize work
(`encode_prompt`, `render_chat` on the tiny demo model's tokenizer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial

import anyio
import attrs
import pytest

from pipeline.channels import Channel, open_channel
from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import (
    Accepted,
    ChatRequest,
    GenerationParams,
    GenerationRequest,
    Message,
    Role,
    Sampling,
    TextRequest,
)
from pipeline.tracing import Mark, Timeline
from stages.messages import Prepared, PrepareJob, PrepKind, PromptText, Reply
from stages.models.loading import Tokenizer
from stages.prompt.chat import render_chat
from stages.prompt.constraints import ConstraintCompiler
from stages.prompt.prepare import INLINE_CHARS, PrepareStage, Reservation, encode_bounded
from stages.prompt.text import encode_prompt, prompt_of
from stages.prompt.tokenize import BoundedEncoder

VOCAB = 1024
WINDOW = 16


def text_job(
    tokenizer: Tokenizer,
    request_id: str,
    prompt: str | tuple[int, ...],
    max_tokens: int | None,
    *,
    logit_bias: dict[int, float] | None = None,
    tokenize: Callable[[], list[int]] | None = None,
) -> PrepareJob:
    params = GenerationParams(max_tokens=max_tokens, sampling=Sampling(logit_bias=logit_bias or {}))
    request = TextRequest(prompt=prompt, params=params)
    return job(request_id, request, tokenize or partial(encode_prompt, tokenizer, VOCAB, prompt))


def job(request_id: str, request: GenerationRequest, tokenize: Callable[[], list[int]]) -> PrepareJob:
    reply: Reply = Reply(request_id)
    timeline = Timeline.start(clock=lambda: 0.0).stamp(Mark.PARSED, 0.0)
    return PrepareJob(
        request_id=request_id,
        kind=PrepKind.TOKENIZE,
        tokenize=tokenize,
        request=request,
        params=request.params,
        reply=reply,
        timeline=timeline,
    )


def stage_for(
    tokenizer: Tokenizer,
    inbox: Channel[PrepareJob],
    out: Channel[Prepared],
    *,
    window: int = WINDOW,
    concurrency: int = 2,
    max_safe_context: int | None = None,
) -> PrepareStage:
    return PrepareStage(
        inbox=inbox.receive,
        out=out.send,
        reservations={PrepKind.TOKENIZE: Reservation.of(concurrency), PrepKind.CONSTRAIN: Reservation.of(1)},
        context_window=window,
        vocab_size=VOCAB,
        compiler=ConstraintCompiler(tokenizer=tokenizer, vocab_size=VOCAB),
        encoder=BoundedEncoder.of(tokenizer),
        max_safe_context=max_safe_context,
    )


async def run_stage(
    tokenizer: Tokenizer, jobs: Sequence[PrepareJob], *, window: int = WINDOW, max_safe_context: int | None = None
) -> list[Prepared]:
    inbox: Channel[PrepareJob] = open_channel(len(jobs) + 1, name="prepare")
    out: Channel[Prepared] = open_channel(len(jobs) + 1, name="gateway")
    stage = stage_for(tokenizer, inbox, out, window=window, max_safe_context=max_safe_context)
    with out.receive, anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(stage.run)
            async with inbox.send:
                for item in jobs:
                    await inbox.send.send(item)
        return [prepared async for prepared in out.receive]


def ids(count: int) -> tuple[int, ...]:
    return tuple(range(1, count + 1))


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "expected_max"),
    [
        pytest.param(4, 12, 12, id="exactly-fills-the-window"),
        pytest.param(4, 1, 1, id="small-request"),
        pytest.param(4, None, WINDOW - 4, id="default-is-the-rest-of-the-window"),
        pytest.param(WINDOW - 1, None, 1, id="one-token-left"),
    ],
)
async def test_a_prompt_that_fits_is_prepared(
    tokenizer: Tokenizer, prompt_tokens: int, max_tokens: int | None, expected_max: int
) -> None:
    """A fitting request goes to the gateway with its tokens and max_tokens (default: window − prompt), and is
    accepted with its prompt size."""
    item = text_job(tokenizer, "r1", ids(prompt_tokens), max_tokens)
    (prepared,) = await run_stage(tokenizer, [item])
    assert (prepared.request_id, prepared.prompt_tokens, prepared.max_tokens) == (
        "r1",
        ids(prompt_tokens),
        expected_max,
    )
    assert (prepared.request, prepared.params, prepared.reply) == (item.request, item.params, item.reply)
    assert prepared.timeline.at(Mark.PREPARED) is not None
    assert await item.reply.accepted() == Accepted(request=item.request, prompt_tokens=prompt_tokens)


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "param", "gist"),
    [
        pytest.param(
            4,
            13,
            "max_tokens",
            "you requested 17 tokens (4 in the prompt, 13 for the completion)",
            id="prompt-plus-max_tokens-over",
        ),
        pytest.param(
            WINDOW,
            1,
            "max_tokens",
            "you requested 17 tokens (16 in the prompt, 1 for the completion)",
            id="prompt-fills-window-with-max_tokens",
        ),
        pytest.param(
            WINDOW,
            None,
            "prompt",
            "you requested 16 tokens (16 in the prompt, 0 for the completion)",
            id="prompt-fills-window",
        ),
        pytest.param(WINDOW + 5, None, "prompt", "(21 in the prompt, 0 for the completion)", id="prompt-over-window"),
    ],
)
async def test_context_overflow_is_a_400(
    tokenizer: Tokenizer, prompt_tokens: int, max_tokens: int | None, param: str, gist: str
) -> None:
    """prompt + max_tokens over the window, or a prompt with no room left, fails with context_length_exceeded."""
    item = text_job(tokenizer, "r1", ids(prompt_tokens), max_tokens)
    assert await run_stage(tokenizer, [item]) == []
    with pytest.raises(RequestError) as caught:
        await item.reply.accepted()
    error = caught.value
    assert (error.kind, error.status, error.code, error.param) == (
        ErrorKind.INVALID_REQUEST,
        400,
        "context_length_exceeded",
        param,
    )
    assert f"maximum context length is {WINDOW} tokens" in error.message
    assert gist in error.message


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "expected_max"),
    [
        pytest.param(4, 4, 4, id="fits-the-budget"),
        pytest.param(4, None, 4, id="default-is-the-rest-of-the-budget"),
        pytest.param(4, 5, None, id="over-the-budget"),
        pytest.param(8, None, None, id="prompt-fills-the-budget"),
    ],
)
async def test_the_memory_budget_caps_a_row_below_the_window(
    tokenizer: Tokenizer, prompt_tokens: int, max_tokens: int | None, expected_max: int | None
) -> None:
    """With a memory budget under the window, a row longer than the budget fails (context_over_budget) before any
    model work."""
    item = text_job(tokenizer, "r1", ids(prompt_tokens), max_tokens)
    prepared = await run_stage(tokenizer, [item], max_safe_context=8)
    if expected_max is not None:
        assert [p.max_tokens for p in prepared] == [expected_max]
        return
    assert prepared == []
    with pytest.raises(RequestError) as caught:
        await item.reply.accepted()
    assert (caught.value.status, caught.value.code) == (400, "context_over_budget")
    assert "at most 8 tokens per request" in caught.value.message


async def test_a_chat_prompt_with_no_room_names_messages(tokenizer: Tokenizer) -> None:
    """For chat, a conversation that fills the window is blamed on `messages`."""
    chat = ChatRequest(
        messages=(Message(role=Role.USER, content="hi"),), params=GenerationParams(max_tokens=None, sampling=Sampling())
    )
    rendered = render_chat(tokenizer, chat)
    item = job("c1", chat, partial(render_chat, tokenizer, chat))
    assert await run_stage(tokenizer, [item], window=len(rendered)) == []
    with pytest.raises(RequestError) as caught:
        await item.reply.accepted()
    assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "messages")


@pytest.mark.parametrize(
    ("make", "param", "gist"),
    [
        pytest.param(
            lambda t: text_job(t, "r1", "", 4), "prompt", "The prompt is empty after tokenization", id="empty-prompt"
        ),
        pytest.param(
            lambda t: text_job(t, "r1", (5000,), 4),
            "prompt",
            "Token id 5000 is outside the vocabulary",
            id="token-id-outside-vocabulary",
        ),
        pytest.param(
            lambda t: text_job(t, "r1", "hi", 4, logit_bias={VOCAB: 5.0, 3: 1.0}),
            "logit_bias",
            "[1024] are outside the vocabulary",
            id="logit_bias-outside-vocabulary",
        ),
    ],
)
async def test_bad_requests_fail_their_reply_only(
    tokenizer: Tokenizer, make: Callable[[Tokenizer], PrepareJob], param: str, gist: str
) -> None:
    """A RequestError from the work fails that reply; the next job is still prepared."""
    bad, good = make(tokenizer), text_job(tokenizer, "ok", "Hello", 2)
    prepared = await run_stage(tokenizer, [bad, good])
    assert [p.request_id for p in prepared] == ["ok"]
    with pytest.raises(RequestError) as caught:
        await bad.reply.accepted()
    assert (caught.value.status, caught.value.param) == (400, param)
    assert gist in caught.value.message


async def test_a_logit_bias_inside_the_vocabulary_is_kept(tokenizer: Tokenizer) -> None:
    """Bias on the last id of the vocabulary is valid and travels to the gateway."""
    item = text_job(tokenizer, "r1", "hi", 2, logit_bias={VOCAB - 1: -100.0})
    (prepared,) = await run_stage(tokenizer, [item])
    assert prepared.params.sampling.logit_bias == {VOCAB - 1: -100.0}


async def test_a_closed_reply_is_skipped_before_any_work(tokenizer: Tokenizer) -> None:
    """A request whose client left is not tokenized and never reaches the gateway."""
    calls: list[str] = []

    def tokenize() -> list[int]:
        calls.append("tokenized")
        return [1, 2]

    item = text_job(tokenizer, "gone", "x", 2, tokenize=tokenize)
    item.reply.close()
    assert await run_stage(tokenizer, [item]) == []
    assert calls == []


async def test_a_kind_runs_at_most_its_reservation_at_once(tokenizer: Tokenizer) -> None:
    """With a reservation of one, a second job does not start until the first one's work is done."""
    release, running, started = threading.Event(), threading.Event(), []

    def slow() -> list[int]:
        started.append("slow")
        running.set()
        release.wait(timeout=10)
        return [1, 2, 3]

    def fast() -> list[int]:
        started.append("fast")
        return [4, 5]

    jobs = [text_job(tokenizer, "slow", "x", 2, tokenize=slow), text_job(tokenizer, "fast", "y", 2, tokenize=fast)]
    inbox: Channel[PrepareJob] = open_channel(4, name="prepare")
    out: Channel[Prepared] = open_channel(4, name="gateway")
    stage = stage_for(tokenizer, inbox, out, concurrency=1)
    with out.receive, anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(stage.run)
            async with inbox.send:
                for item in jobs:
                    await inbox.send.send(item)
                await anyio.to_thread.run_sync(running.wait, 10)
                await anyio.wait_all_tasks_blocked()
                assert started == ["slow"]
                release.set()
        prepared = [p.request_id async for p in out.receive]
    assert started == ["slow", "fast"]
    assert sorted(prepared) == ["fast", "slow"]


async def test_a_check_runs_on_the_loop_and_a_render_off_it(tokenizer: Tokenizer) -> None:
    """A job marked `inline` (a text prompt's check) skips the thread hand-off; any other job's work leaves the loop."""
    loop_thread, ran_on = threading.get_ident(), {}

    def noting(name: str) -> Callable[[], list[int]]:
        def tokenize() -> list[int]:
            ran_on[name] = threading.get_ident()
            return [1, 2]

        return tokenize

    rendered = text_job(tokenizer, "render", "x", 2, tokenize=noting("render"))
    checked = attrs.evolve(text_job(tokenizer, "check", "y", 2, tokenize=noting("check")), inline=True)
    prepared = await run_stage(tokenizer, [rendered, checked])
    assert sorted(p.request_id for p in prepared) == ["check", "render"]
    assert ran_on["check"] == loop_thread
    assert ran_on["render"] != loop_thread


@pytest.mark.parametrize("length", [INLINE_CHARS - 1, INLINE_CHARS + 1, 3 * INLINE_CHARS])
async def test_a_text_prompt_has_the_same_tokens_on_the_loop_or_off_it(tokenizer: Tokenizer, length: int) -> None:
    """Short pieces are encoded on the loop, longer ones in a thread: the tokens are the tokenizer's either way."""
    text = ("The server reads a request.\nNumbers 0, 1, 2 and 42 appear. " * 200)[:length]
    (prepared,) = await run_stage(
        tokenizer, [text_job(tokenizer, "text", text, 1, tokenize=lambda: prompt_of(VOCAB, text))], window=100_000
    )
    assert list(prepared.prompt_tokens) == tokenizer.encode(text)


async def test_a_short_piece_past_the_bound_is_cut_off_on_the_loop_too(tokenizer: Tokenizer) -> None:
    """A prompt short enough to tokenize on the loop still stops at the bound, as a piece in a thread does."""
    text = PromptText("word " * 100, add_special_tokens=False)
    assert len(text.text) <= INLINE_CHARS
    encoder, reservation = BoundedEncoder.of(tokenizer), Reservation.of(1)
    tokens = encoder.encode(text)
    # Past the length's lower bound (so the cheap refusal lets it through), short of its tokens.
    at_most = encoder.min_tokens(text)
    assert at_most < len(tokens)
    assert await encode_bounded(encoder, text, reservation, at_most=at_most) is None
    assert await encode_bounded(encoder, text, reservation, at_most=len(tokens)) == tokens
