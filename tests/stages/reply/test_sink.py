"""stages/reply/sink.py: per-step token deltas → text events on each request's reply.

The sink is driven through its own streams: `StepOutputs` in (as the
gateway sends them), events on each `ReplySlot` and `Abort`s on the
control channel out. Tokens come from the tiny demo model's real
tokenizer, so detokenization is mlx-lm's, byte-level BPE and all.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs
import pytest
import structlog.testing

from pipeline.channels import Channel, open_channel
from pipeline.events import CompletionEvent, FinishReason, ReasoningDelta, Summary, TextDelta, Usage
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
from stages.messages import Abort, Admitted, Prepared, Reply, StepOutputs, TokenDelta
from stages.models.loading import Tokenizer
from stages.reply.sink import CompletionSink

PROMPT = (5, 6, 7, 8)
TEXT = "Hello, world! The server reads a request."


@attrs.define
class Row:
    request_id: str
    reply: Reply
    admitted: Admitted


def row(request_id: str, stop: tuple[str, ...] = (), prompt: tuple[int, ...] = PROMPT, *, chat: bool = False) -> Row:
    """A row as the gateway admits it: a raw completion, or with `chat` a chat request."""
    params = GenerationParams(max_tokens=64, sampling=Sampling(), stop=stop)
    request: GenerationRequest = (
        ChatRequest(messages=(Message(role=Role.USER, content="hi"),), params=params)
        if chat
        else TextRequest(prompt=prompt, params=params)
    )
    reply: Reply = Reply(request_id)
    reply.accept(Accepted(request=request, prompt_tokens=len(prompt)))
    timeline = Timeline.start(clock=lambda: 1.0).stamp(Mark.PARSED, 1.1).stamp(Mark.PREPARED, 1.2)
    prepared = Prepared(
        request_id=request_id,
        request=request,
        prompt_tokens=prompt,
        max_tokens=64,
        params=params,
        reply=reply,
        timeline=timeline,
    )
    return Row(request_id, reply, Admitted(prepared=prepared, admitted_at=1.5))


def steps_for(request_id: str, tokens: Sequence[int], per_step: int, finish: FinishReason | None) -> list[TokenDelta]:
    chunks = [tuple(tokens[i : i + per_step]) for i in range(0, len(tokens), per_step)]
    return [
        TokenDelta(request_id=request_id, new_token_ids=chunk, finish=finish if i == len(chunks) - 1 else None)
        for i, chunk in enumerate(chunks)
    ]


async def drive(tokenizer: Tokenizer, outputs: Sequence[StepOutputs]) -> list[Abort]:
    """Run the sink over `outputs` until its inbox ends; return the aborts it sent."""
    steps: Channel[StepOutputs] = open_channel(len(outputs) + 1, name="steps")
    control: Channel[Abort] = open_channel(16, name="control")
    sink = CompletionSink(inbox=steps.receive, aborts=control.send, tokenizer=tokenizer)
    with control.receive, anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(sink.run)
            async with steps.send:
                for output in outputs:
                    await steps.send.send(output)
        return [abort async for abort in control.receive]


def single_row_outputs(target: Row, deltas: Sequence[TokenDelta]) -> list[StepOutputs]:
    """One step admitting the row, then one step per delta (as the gateway does)."""
    first = StepOutputs(admitted=(target.admitted,), deltas=(), stepped_at=2.0)
    return [first] + [StepOutputs(admitted=(), deltas=(d,), stepped_at=3.0 + i) for i, d in enumerate(deltas)]


async def events_of(reply: Reply) -> list[CompletionEvent]:
    return [event async for batch in reply for event in batch]


def text_of(events: Sequence[CompletionEvent]) -> str:
    """The text of events that must all be non-empty TextDeltas."""
    texts = [event.text for event in events if isinstance(event, TextDelta) and event.text]
    assert len(texts) == len(events), events
    return "".join(texts)


def eos_ids(tokenizer: Tokenizer) -> list[int]:
    return sorted(tokenizer.eos_token_ids)


TEXTS = [
    pytest.param(TEXT, id="ascii"),
    pytest.param("café ☕ 日本語", id="multi-byte-utf8"),
    pytest.param("a  b   c\n\nd", id="runs-of-spaces-and-newlines"),
    # A raw completion is plain text: markup is not split out of it.
    pytest.param("<think>plan</think>answer", id="think-markers-kept-as-text"),
]


@pytest.mark.parametrize("per_step", [1, 2, 3, 1000], ids=["1-token-per-step", "2", "3", "all-at-once"])
@pytest.mark.parametrize("text", TEXTS)
async def test_text_deltas_rebuild_the_decoded_text(tokenizer: Tokenizer, text: str, per_step: int) -> None:
    """Concatenated TextDeltas equal tokenizer.decode of the tokens, however tokens are grouped per step."""
    tokens = tokenizer.encode(text)
    assert tokenizer.decode(tokens) == text
    target = row("r1")
    aborts = await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, per_step, FinishReason.LENGTH)))
    assert text_of(await events_of(target.reply)) == text
    assert target.reply.summary == Summary(
        finish_reason=FinishReason.LENGTH,
        usage=Usage(prompt_tokens=len(PROMPT), completion_tokens=len(tokens)),
    )
    assert aborts == []


async def test_a_leading_space_is_kept(tokenizer: Tokenizer) -> None:
    """A completion that starts with a space keeps it: "The capital is" + " Paris", not "Paris"."""
    tokens = tokenizer.encode(" Paris, and more")
    assert tokenizer.decode(tokens) == " Paris, and more"
    target = row("r1")
    await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, 1, FinishReason.LENGTH)))
    assert text_of(await events_of(target.reply)) == " Paris, and more"


@pytest.mark.parametrize("per_step", [1, 1000], ids=["1-token-per-step", "all-at-once"])
async def test_chat_reasoning_is_split_from_the_answer(tokenizer: Tokenizer, per_step: int) -> None:
    """In a chat reply, text inside <think>…</think> is reasoning and the rest the answer; no marker is streamed."""
    tokens = tokenizer.encode("<think>plan it</think>The answer.")
    target = row("r1", chat=True)
    await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, per_step, FinishReason.LENGTH)))
    events = await events_of(target.reply)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert (reasoning, answer) == ("plan it", "The answer.")
    assert all(isinstance(e, (ReasoningDelta, TextDelta)) for e in events)


async def test_eos_token_ends_with_stop_and_is_not_emitted(tokenizer: Tokenizer) -> None:
    """The EOS token that ends a row counts as a completion token but never appears as text."""
    tokens = tokenizer.encode(TEXT) + [eos_ids(tokenizer)[0]]
    target = row("r1")
    aborts = await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, 1, FinishReason.STOP)))
    assert text_of(await events_of(target.reply)) == TEXT
    assert target.reply.summary == Summary(
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=len(PROMPT), completion_tokens=len(tokens)),
        stop_sequence=None,
    )
    assert aborts == []


@pytest.mark.parametrize("eos", ["<|im_end|>", "<|endoftext|>"])
async def test_every_eos_id_is_silent(tokenizer: Tokenizer, eos: str) -> None:
    """Both EOS ids of the demo model are dropped from the text."""
    (eos_id,) = tokenizer.encode(eos)
    assert eos_id in tokenizer.eos_token_ids
    tokens = tokenizer.encode("ok") + [eos_id]
    target = row("r1")
    await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, 1, FinishReason.STOP)))
    assert text_of(await events_of(target.reply)) == "ok"


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param("server", id="word"),
        pytest.param("ver rea", id="spans-tokens"),
        pytest.param("He", id="at-start"),
        pytest.param("st.", id="at-end"),
    ],
)
async def test_stop_string_finishes_the_row_and_aborts_it(tokenizer: Tokenizer, stop: str) -> None:
    """A stop string ends the reply with STOP and its stop_sequence, no part of it emitted, and one Abort sent."""
    tokens = tokenizer.encode(TEXT)
    target = row("r1", stop=(stop, "never-seen"))
    deltas = steps_for("r1", tokens, 1, None)
    # The gateway may run one more step before the abort lands; the sink ignores it.
    deltas.append(TokenDelta(request_id="r1", new_token_ids=tuple(tokens[:1]), finish=None))
    aborts = await drive(tokenizer, single_row_outputs(target, deltas))
    events = await events_of(target.reply)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == TEXT[: TEXT.index(stop)]
    assert all(isinstance(e, TextDelta) for e in events)
    summary = target.reply.summary
    assert (summary.finish_reason, summary.stop_sequence) == (FinishReason.STOP, stop)
    consumed = next(i for i in range(1, len(tokens) + 1) if stop in tokenizer.decode(tokens[:i]))
    assert summary.usage == Usage(prompt_tokens=len(PROMPT), completion_tokens=consumed)
    # No delta carried a finish, so the row is still running in the gateway: drop it.
    assert aborts == [Abort(request_id="r1")]


async def test_stop_on_the_final_step_sends_no_abort(tokenizer: Tokenizer) -> None:
    """When the stop completes on a row's last step the row is already gone: STOP, no Abort."""
    tokens = tokenizer.encode(TEXT)
    target = row("r1", stop=("request.",))
    aborts = await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, 1, FinishReason.LENGTH)))
    assert text_of(await events_of(target.reply)) == TEXT[: TEXT.index("request.")]
    assert (target.reply.summary.finish_reason, target.reply.summary.stop_sequence) == (FinishReason.STOP, "request.")
    assert aborts == []


async def test_length_finish_flushes_a_held_stop_prefix(tokenizer: Tokenizer) -> None:
    """Text held back as a possible stop prefix is emitted when the row ends by length."""
    tokens = tokenizer.encode(TEXT)
    target = row("r1", stop=("request. And",))
    await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, 1, FinishReason.LENGTH)))
    assert text_of(await events_of(target.reply)) == TEXT
    assert target.reply.summary.stop_sequence is None


async def test_a_closed_reply_is_dropped_and_other_rows_carry_on(tokenizer: Tokenizer) -> None:
    """After a reader leaves, its row's deltas are dropped quietly; the other rows in the batch are unaffected."""
    left, stays = row("left"), row("stays")
    tokens = tokenizer.encode(TEXT)
    outputs = [StepOutputs(admitted=(left.admitted, stays.admitted), deltas=(), stepped_at=2.0)]
    for i, token in enumerate(tokens):
        finish = FinishReason.LENGTH if i == len(tokens) - 1 else None
        outputs.append(
            StepOutputs(
                admitted=(),
                deltas=(
                    TokenDelta(request_id="left", new_token_ids=(token,), finish=finish),
                    TokenDelta(request_id="stays", new_token_ids=(token,), finish=finish),
                ),
                stepped_at=3.0 + i,
            )
        )
    left.reply.close()
    aborts = await drive(tokenizer, outputs)
    assert left.reply.closed
    assert await events_of(left.reply) == []
    with pytest.raises(RuntimeError):
        left.reply.summary  # noqa: B018
    assert text_of(await events_of(stays.reply)) == TEXT
    assert stays.reply.summary.finish_reason is FinishReason.LENGTH
    # The reader's own close() sends the gateway its abort; the sink sends none
    # (docs/STYLE.md, "Cancellation through scopes").
    assert aborts == []


async def test_rows_are_detokenized_independently(tokenizer: Tokenizer) -> None:
    """Interleaved rows in the same steps never mix their text or counts."""
    first, second = row("a"), row("b")
    ta, tb = tokenizer.encode("café ☕ one"), tokenizer.encode("Hello two, three")
    steps = max(len(ta), len(tb))
    outputs = [StepOutputs(admitted=(first.admitted, second.admitted), deltas=(), stepped_at=2.0)]
    for i in range(steps):
        deltas = []
        for request_id, tokens in (("a", ta), ("b", tb)):
            if i < len(tokens):
                finish = FinishReason.LENGTH if i == len(tokens) - 1 else None
                deltas.append(TokenDelta(request_id=request_id, new_token_ids=(tokens[i],), finish=finish))
        outputs.append(StepOutputs(admitted=(), deltas=tuple(deltas), stepped_at=3.0 + i))
    await drive(tokenizer, outputs)
    assert text_of(await events_of(first.reply)) == "café ☕ one"
    assert text_of(await events_of(second.reply)) == "Hello two, three"
    assert first.reply.summary.usage.completion_tokens == len(ta)
    assert second.reply.summary.usage.completion_tokens == len(tb)


async def test_deltas_for_unknown_rows_are_ignored(tokenizer: Tokenizer) -> None:
    """A delta for a row the sink does not know (already finished) changes nothing."""
    target = row("r1")
    tokens = tokenizer.encode("ok")
    outputs = single_row_outputs(target, steps_for("r1", tokens, 1, FinishReason.LENGTH))
    outputs.append(StepOutputs(admitted=(), deltas=(TokenDelta(request_id="r1", new_token_ids=(9,)),), stepped_at=9))
    outputs.append(StepOutputs(admitted=(), deltas=(TokenDelta(request_id="ghost", new_token_ids=(9,)),), stepped_at=9))
    await drive(tokenizer, outputs)
    assert text_of(await events_of(target.reply)) == "ok"


async def test_one_canonical_finish_line_per_request(tokenizer: Tokenizer) -> None:
    """Each request logs request.queue, request.prefill, request.decode and one request.finish, with timings from
    its stamps."""
    tokens = tokenizer.encode("Hello, world!")
    target = row("r1")
    with structlog.testing.capture_logs() as logs:
        await drive(tokenizer, single_row_outputs(target, steps_for("r1", tokens, 1, FinishReason.LENGTH)))
    events = [entry["event"] for entry in logs]
    assert events == ["request.queue", "request.prefill", "request.decode", "request.finish"]
    finish = logs[-1]
    last_step = 3.0 + len(tokens) - 1
    assert finish["request_id"] == "r1" and finish["trace_id"] == "r1"
    assert (finish["finish_reason"], finish["prompt_tokens"], finish["completion_tokens"]) == (
        "length",
        len(PROMPT),
        len(tokens),
    )
    assert finish["queue"] == pytest.approx(1.5 - 1.2)
    assert finish["prefill"] == pytest.approx(3.0 - 1.5)
    assert finish["decode"] == pytest.approx(last_step - 3.0)
    assert finish["total"] == pytest.approx(last_step - 1.0)


@pytest.mark.parametrize("finish_first", [False, True])
async def test_no_row_state_outlives_its_request(tokenizer: Tokenizer, finish_first: bool) -> None:
    """A reader that leaves between steps gets no further delta (the gateway removed its row): its state goes with
    the removal."""
    left, done = row("left"), row("done")
    tokens = tokenizer.encode(TEXT)
    steps: Channel[StepOutputs] = open_channel(8, name="steps")
    control: Channel[Abort] = open_channel(16, name="control")
    sink = CompletionSink(inbox=steps.receive, aborts=control.send, tokenizer=tokenizer)
    with control.receive, anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(sink.run)
            async with steps.send:
                first = (TokenDelta(request_id="left", new_token_ids=tuple(tokens[:2])),)
                await steps.send.send(
                    StepOutputs(admitted=(left.admitted, done.admitted), deltas=first, stepped_at=2.0)
                )
                await anyio.wait_all_tasks_blocked()
                assert sink.open_rows == 2
                left.reply.close()
                finish = FinishReason.LENGTH if finish_first else None
                last = (TokenDelta(request_id="done", new_token_ids=tuple(tokens[:1]), finish=finish),)
                # As the gateway reports it: "left" was removed before this step, with no delta of its own.
                await steps.send.send(StepOutputs(admitted=(), deltas=last, stepped_at=3.0, removed=("left",)))
                await anyio.wait_all_tasks_blocked()
                assert sink.open_rows == (0 if finish_first else 1)


@pytest.mark.parametrize("finish", [None, FinishReason.STOP], ids=["running", "ended-by-the-error-mask"])
async def test_a_grammar_fault_fails_the_row_never_a_stop(tokenizer: Tokenizer, finish: FinishReason | None) -> None:
    """A row whose grammar failed mid-generation ends with a 400 naming the field, logged; the text made with
    the fault is not sent, and the row still running in the gateway is dropped."""
    from pipeline.errors import RequestError

    tokens = tokenizer.encode(TEXT)
    target = row("r1")
    deltas = steps_for("r1", tokens[:3], 1, None)
    deltas.append(TokenDelta(request_id="r1", new_token_ids=(tokens[3],), finish=finish, grammar_fault="limit hit"))
    with structlog.testing.capture_logs() as logs:
        aborts = await drive(tokenizer, single_row_outputs(target, deltas))
    with pytest.raises(RequestError) as caught:
        await events_of(target.reply)
    assert caught.value.status == 400 and caught.value.code == "invalid_grammar"
    assert caught.value.param == "response_format" and "limit hit" in caught.value.message
    assert aborts == ([Abort(request_id="r1")] if finish is None else [])
    faults = [entry for entry in logs if entry["event"] == "request.grammar_fault"]
    assert len(faults) == 1 and faults[0]["request_id"] == "r1" and "limit hit" in faults[0]["reason"]
