"""stages/prompt/parse.py: a body its route has already read as JSON is decoded as read, not read again.

The Responses route reads a body to decode it before its store lookup (edge/responses_turn.py); the parse
stage then takes that value as it is. The stage is driven through its own streams with the real chat and
text jobs and a real decoder.
"""

from __future__ import annotations

import anyio

from pipeline.requests import GenerationRequest, JsonValue, TextRequest
from pipeline.tracing import Timeline
from stages.messages import PrepareJob, ReadBody, Reply, Submission
from stages.models.loading import Tokenizer
from stages.prompt.chat import ChatJobs
from stages.prompt.parse import ParseStage
from stages.prompt.text import TextJobs
from wire.openai_requests import decode_completion


async def test_a_body_its_route_read_reaches_the_decoder_and_the_adapter_route_as_read(tokenizer: Tokenizer) -> None:
    read: JsonValue = {"model": "tiny", "prompt": "Hello", "max_tokens": 3}
    decoded: list[JsonValue] = []
    routed: list[JsonValue] = []

    def decode(value: JsonValue) -> GenerationRequest:
        decoded.append(value)
        return decode_completion(value)

    def route(value: JsonValue) -> str | None:
        routed.append(value)
        return None

    submissions, inbox = anyio.create_memory_object_stream[Submission](1)
    out, jobs = anyio.create_memory_object_stream[PrepareJob](1)
    stage = ParseStage(
        inbox=inbox, out=out, chat=ChatJobs(tokenizer=tokenizer), text=TextJobs(vocab_size=64), route=route
    )
    reply = Reply("cmpl-1")
    async with anyio.create_task_group() as group, jobs:
        await group.start(stage.run)
        async with submissions:
            body = ReadBody(read)
            await submissions.send(
                Submission(request_id="cmpl-1", body=body, decode=decode, reply=reply, timeline=Timeline.start())
            )
        job = await jobs.receive()
    assert not reply.done
    assert isinstance(job.request, TextRequest) and job.request.prompt == "Hello"
    assert decoded == [read] and decoded[0] is read
    assert routed == [read] and routed[0] is read
