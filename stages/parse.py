"""Parse stage: raw JSON bytes → a typed request.

Inbox: `Submission` from the HTTP handler (via admission).
Outbox: `Parsed` to the chat stage or the text stage, by request type.
Owns: nothing between requests.
On cancel: a submission whose reply is closed is dropped unread.
On error: bad JSON or a decoder's `RequestError` fails that reply (400).
"""

from __future__ import annotations

import json

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.errors import RequestError, invalid
from pipeline.requests import ChatRequest, JsonValue
from pipeline.tracing import Mark
from stages.messages import Parsed, Submission

log = structlog.get_logger(stage="parse")


@attrs.define
class ParseStage:
    _inbox: MemoryObjectReceiveStream[Submission] = attrs.field(alias="inbox")
    _chat: MemoryObjectSendStream[Parsed] = attrs.field(alias="chat")
    _text: MemoryObjectSendStream[Parsed] = attrs.field(alias="text")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._inbox, self._chat, self._text:
            task_status.started()
            async for submission in self._inbox:
                await self._on_submission(submission)

    async def _on_submission(self, submission: Submission) -> None:
        if submission.reply.closed:
            return
        try:
            request = submission.decode(load_json(submission.body))
        except RequestError as error:
            submission.reply.fail(error)
            return
        timeline = submission.timeline.stamp(Mark.PARSED)
        log.info(
            "request.parse", **submission.reply.log_context, duration=timeline.between(Mark.RECEIVED, Mark.PARSED)
        )
        parsed = Parsed(request_id=submission.request_id, request=request, reply=submission.reply, timeline=timeline)
        await (self._chat if isinstance(request, ChatRequest) else self._text).send(parsed)


def _refuse_constant(name: str) -> None:
    # Python's json reads NaN and Infinity, which JSON does not have.
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def load_json(body: bytes) -> JsonValue:
    """Decode a request body.

    Raises:
        RequestError: the body is not UTF-8 JSON.
    """
    try:
        value: JsonValue = json.loads(body, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise invalid(f"The request body is not valid JSON: {error}") from None
    return value
