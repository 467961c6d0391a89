"""stages/remote/: the typed crossing between the front and a model worker, over a real Unix socket (no model).

The invariants: every message survives the frame round trip with its type;
a broken frame is an error, not a hang or a wrong message; a peer that stops
reading holds the writer back within a bounded number of bytes; a row and a
step cross with every field the model side and the sink read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import attrs
import msgspec
import pytest
from anyio.abc import ByteStream

from pipeline.errors import ErrorKind, RequestError, invalid
from pipeline.events import FinishReason
from pipeline.requests import GenerationParams, Sampling, TextRequest
from pipeline.settings import Settings
from pipeline.tracing import Timeline
from stages.adapters import Adapter
from stages.engine.decisions import plan_memory, served_model
from stages.messages import Admitted, CompiledConstraint, Grammar, Prepared, Reply, StepOutputs, TokenDelta
from stages.remote.convert import error_out, prepared_of, request_error, row_in, step_out, step_outputs
from stages.remote.crossing import (
    AbortIn,
    BeatOut,
    CancelIn,
    CloseIn,
    JobIn,
    JobOut,
    ReadyOut,
    RowIn,
    SettingsIn,
    StartIn,
    StatsIn,
    StepOut,
    ToFront,
    ToWorker,
)
from stages.remote.frames import MAX_FRAME, FrameError, FrameReader, FrameWriter
from stages.remote.loop_stream import loop_stream


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[ByteStream, ByteStream]]:
    async with await anyio.create_unix_listener(tmp_path / "s.sock", mode=0o600) as listener:
        # The front's end as the front holds it (stages/remote/process.py): on asyncio, the loop's own stream.
        client = await loop_stream(await anyio.connect_unix(tmp_path / "s.sock"))
        server = await listener.accept()
        async with client, server:
            yield client, server


async def test_every_message_crosses_with_its_type(pair: tuple[ByteStream, ByteStream]) -> None:
    """Both directions: each message decodes as the one sent, tagged unions and all."""
    front, worker = pair
    to_worker: list[ToWorker] = [
        SettingsIn(
            values={"model": None, "max_batch": 16, "exclusive_share": 0.15, "single_row": True}, start=start_in()
        ),
        AbortIn(request_id="a"),
        CancelIn(job_id=3),
        CloseIn(),
        StatsIn(),
        JobIn(job_id=1, kind="score", inputs=[[1, 2], [3]], request_id="r", trace_id="t", rate_key="m", yes=5, no=6),
    ]
    to_front: list[ToFront] = [
        ReadyOut(pid=42),
        BeatOut(),
        JobOut(job_id=1, scores=[0.5]),
        JobOut(job_id=2, vectors=[b"\0\0\x80?"]),
        step_out(
            StepOutputs(admitted=(), deltas=(TokenDelta(request_id="a", new_token_ids=(7,)),), stepped_at=1.5), []
        ),
    ]
    writer, reader = FrameWriter(front), FrameReader[ToWorker](worker, ToWorker)
    for message in to_worker:
        await writer.send(message)
    assert [await reader.receive() for _ in to_worker] == to_worker
    back, front_reader = FrameWriter(worker), FrameReader[ToFront](front, ToFront)
    for answer in to_front:
        await back.send(answer)
    assert [await front_reader.receive() for _ in to_front] == to_front


async def test_a_broken_frame_is_an_error(pair: tuple[ByteStream, ByteStream]) -> None:
    """A frame past the bound, garbage, or a stream cut inside a frame: FrameError; a clean close: EndOfStream."""
    front, worker = pair
    reader = FrameReader[ToWorker](worker, ToWorker)
    await front.send((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(FrameError, match="past the bound"):
        await reader.receive()
    await front.send((3).to_bytes(4, "big") + b"\xc1\xc1\xc1")
    reader = FrameReader[ToWorker](worker, ToWorker)
    with pytest.raises(FrameError):
        await reader.receive()
    await front.send((10).to_bytes(4, "big") + b"abc")
    await front.aclose()
    with pytest.raises(FrameError, match="inside a frame"):
        await FrameReader[ToWorker](worker, ToWorker).receive()


async def bytes_written_until_held(stream: ByteStream) -> int | None:
    """Step frames written to `stream`, whose peer reads nothing, until a write blocks for a second: the bytes sent
    by then, or None if 64 MiB went through without one blocking."""
    writer = FrameWriter(stream)
    step = StepOut(admitted=[], deltas=(), removed=["x" * 1000], stepped_at=0.0)
    size = len(msgspec.msgpack.encode(step)) + 4
    sent = 0
    with anyio.move_on_after(1.0) as scope:
        while sent < 64 * 1024 * 1024:
            await writer.send(step)
            sent += size
    return sent if scope.cancelled_caught else None


async def test_a_peer_that_stops_reading_holds_the_writer_back(pair: tuple[ByteStream, ByteStream]) -> None:
    """Back-pressure: with nobody reading, writing blocks after a bounded number of bytes (the socket's buffers)."""
    front, _worker = pair
    sent = await bytes_written_until_held(front)
    assert sent is not None, "the writer was never held back"
    assert sent < 16 * 1024 * 1024


def start_in() -> StartIn:
    """The front's start-up decisions for the tiny demo model, with an adapter: paths cross as paths."""
    settings = Settings(demo_model="tiny")
    info = served_model(settings)
    served, fit, _ = plan_memory(settings, info, adapter_bytes=0, cluster=None)
    lora = Adapter(name="lora", path=info.path / "lora", fine_tune_type="lora", num_layers=2, nbytes=10)
    return StartIn(info=served, fit=fit, adapters=(lora,), think=("<think>", "</think>"))


def prepared(constraint: CompiledConstraint | None = None) -> Prepared:
    sampling = Sampling(temperature=0.7, top_p=0.9, top_k=5, seed=3, presence_penalty=0.1, logit_bias={4: -2.0})
    params = GenerationParams(
        max_tokens=9,
        sampling=sampling,
        stop=("end",),
        cache_key="s",
        logprobs=2,
        thinking_budget=4,
        min_tokens=1,
        ignore_eos=True,
        stop_token_ids=(8,),
        adapter="lora",
    )
    return Prepared(
        request_id="r1",
        request=TextRequest(prompt="hi", params=params),
        prompt_tokens=(1, 2, 3),
        max_tokens=9,
        params=params,
        reply=Reply("r1", "trace"),
        timeline=Timeline.start(),
        constraint=constraint,
    )


def test_a_row_crosses_with_what_the_model_side_reads() -> None:
    """Tokens, limits, the parameters as the front holds them and the grammar arrive; the request stays in the
    front."""
    grammar = Grammar(text='start: "a"', param="response_format")
    row = prepared(CompiledConstraint(prototype=None, grammar=grammar))  # type: ignore[arg-type]
    sent = msgspec.msgpack.decode(msgspec.msgpack.encode(row_in(row)), type=ToWorker)
    assert not isinstance(sent, (SettingsIn, AbortIn, CancelIn, CloseIn, StatsIn, JobIn))
    assert (sent.grammar, sent.grammar_param, sent.trace_id) == (grammar.text, grammar.param, "trace")
    arrived = prepared_of(sent, Reply("r1"), None)
    assert arrived.prompt_tokens == row.prompt_tokens and arrived.max_tokens == row.max_tokens
    assert arrived.params == row.params and arrived.request is None


# A value other than its default for each sampling field.
SAMPLING = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.05,
    "seed": 3,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "repetition_penalty": 1.1,
    "logit_bias": {4: -2.0},
    "typical_p": 0.95,
}


def test_every_sampling_field_crosses_as_it_is() -> None:
    """`Sampling` crosses as the attrs class it is: every field msgspec sees is one of attrs' (a new one crosses with
    no code here), and the values, int-keyed logit bias included, arrive unchanged."""
    crossing = {field.name for field in msgspec.inspect.type_info(Sampling).fields}  # type: ignore[attr-defined]
    assert crossing == {field.name for field in attrs.fields(Sampling)}
    sampling = Sampling(**SAMPLING)  # type: ignore[arg-type]
    row = attrs.evolve(prepared(), params=attrs.evolve(prepared().params, sampling=sampling))
    sent = msgspec.msgpack.decode(msgspec.msgpack.encode(row_in(row)), type=ToWorker)
    assert isinstance(sent, RowIn)
    assert prepared_of(sent, Reply("r1"), None).params.sampling == sampling


def test_a_batch_lines_row_crosses_at_idle_priority() -> None:
    """The worker's KV scheduler preempts idle rows first: the mark must reach it (stages/kv/scheduler.py)."""
    for idle in (True, False):
        row = attrs.evolve(prepared(), params=attrs.evolve(prepared().params, idle=idle))
        sent = msgspec.msgpack.decode(msgspec.msgpack.encode(row_in(row)), type=ToWorker)
        assert isinstance(sent, RowIn)
        assert prepared_of(sent, Reply("r1"), None).params.idle is idle


def test_a_step_crosses_back_to_the_rows_the_front_holds() -> None:
    """Admitted rows get the front's own Prepared (its reply); finish, logprobs and removed rows survive."""
    row = prepared()
    outputs = StepOutputs(
        admitted=(Admitted(prepared=row, admitted_at=2.0, cached_tokens=1),),
        deltas=(
            TokenDelta(
                request_id="r1", new_token_ids=(5,), finish=FinishReason.LENGTH, logprobs=((-0.5, ((5, -0.5),)),)
            ),
        ),
        stepped_at=3.0,
        removed=("gone",),
    )
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(step_out(outputs, [])), type=ToFront)
    assert isinstance(wire, StepOut)
    assert step_outputs(wire, {"r1": row}) == outputs


def test_a_grammar_fault_crosses_so_the_front_fails_the_row() -> None:
    """A matcher error mid-generation ends the row with an error at the front, never a plain stop."""
    row = prepared()
    fault = TokenDelta(request_id="r1", new_token_ids=(5,), finish=FinishReason.STOP, grammar_fault="lexer error")
    outputs = StepOutputs(admitted=(), deltas=(fault,), stepped_at=3.0)
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(step_out(outputs, [])), type=ToFront)
    assert isinstance(wire, StepOut)
    assert step_outputs(wire, {"r1": row}).deltas[0].grammar_fault == "lexer error"


def test_an_error_crosses_as_the_same_request_error() -> None:
    error = invalid("bad grammar", param="response_format", code="x")
    back = request_error(error_out(error))
    assert (back.kind, back.message, back.param, back.code) == (
        ErrorKind.INVALID_REQUEST,
        "bad grammar",
        "response_format",
        "x",
    )
    assert isinstance(back, RequestError)
