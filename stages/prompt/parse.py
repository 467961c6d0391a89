"""Parse stage: raw JSON bytes → a typed request → its tokenizing job.

Inbox: `Submission` from the HTTP handler (via admission): the body's bytes, or the JSON value its route
already read (`ReadBody`: a Responses turn's, which is decoded before its store lookup), never read twice.
Outbox: `PrepareJob` for the preparation executor, made by the request's kind:
a chat template's render (`chat.py`) or a text prompt (`text.py`).
Owns: nothing between requests.
On cancel: a submission whose reply is closed is dropped unread.
On error: bad JSON, JSON nested too deep, a decoder's `RequestError` or a
job's (`text.py`: a suffix without infill) fails that reply (400); anything
else fails it with 500 (`pipeline/actor.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.actor import serve_items
from pipeline.errors import invalid
from pipeline.jsontext import MAX_DEPTH, LoneSurrogate, TooDeep, loads
from pipeline.requests import ChatRequest, JsonValue, with_adapter
from pipeline.tracing import Mark
from stages.messages import Parsed, PrepareJob, ReadBody, Submission
from stages.prompt.chat import ChatJobs
from stages.prompt.text import TextJobs

log = structlog.get_logger(stage="parse")


@attrs.define
class ParseStage:
    _inbox: MemoryObjectReceiveStream[Submission] = attrs.field(alias="inbox")
    _out: MemoryObjectSendStream[PrepareJob] = attrs.field(alias="out")
    _chat: ChatJobs = attrs.field(alias="chat")
    _text: TextJobs = attrs.field(alias="text")
    # The LoRA adapter a body's `model` asks for (stages/adapters.py); None: the server serves none.
    _route: Callable[[JsonValue], str | None] | None = attrs.field(default=None, alias="route")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._inbox, self._out:
            task_status.started()
            await serve_items(self._inbox, self._on_submission, stage="parse")

    async def _on_submission(self, submission: Submission) -> None:
        body = submission.body
        value = body.value if isinstance(body, ReadBody) else load_json(body)
        request = submission.decode(value)
        if self._route is not None:
            request = with_adapter(request, self._route(value))
        timeline = submission.timeline.stamp(Mark.PARSED)
        log.info("request.parse", **submission.reply.log_context, duration=timeline.between(Mark.RECEIVED, Mark.PARSED))
        parsed = Parsed(request_id=submission.request_id, request=request, reply=submission.reply, timeline=timeline)
        job = self._chat.job(parsed, request) if isinstance(request, ChatRequest) else self._text.job(parsed, request)
        await self._out.send(job)


def load_json(body: bytes) -> JsonValue:
    """Decode a request body.

    Raises:
        RequestError: the body is not UTF-8 JSON, nests too deep, or holds a string that is not Unicode text.
    """
    try:
        # Decoded here, strictly: json.loads would take UTF-16 and UTF-32 bytes too, and JSON between systems is UTF-8.
        return loads(body.decode("utf-8"))
    except TooDeep:
        raise invalid(f"The request body nests deeper than {MAX_DEPTH} levels") from None
    except LoneSurrogate as error:
        raise invalid(f"Invalid request body: {error}", param=error.path or None) from None
    except UnicodeDecodeError:
        raise invalid("The request body is not valid UTF-8") from None
    except json.JSONDecodeError as error:
        raise invalid(
            f"The request body is not valid JSON: {error.msg} (line {error.lineno} column {error.colno})"
        ) from None
    except ValueError:
        # Python's int() refuses numbers of more than 4300 digits.
        raise invalid("The request body holds a number too long to read") from None
