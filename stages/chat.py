"""Chat stage: messages → a tokenizing job for the preparation executor.

Inbox: `Parsed` carrying a `ChatRequest`.
Outbox: `PrepareJob` whose `tokenize` renders the model's chat template.
Owns: the tokenizer reference (read-only; rendering runs in a worker thread).
On cancel: a request whose reply is closed is dropped.
On error: a template that rejects the messages fails that reply (400).
"""

from __future__ import annotations

from functools import partial

import anyio
import attrs
import jinja2
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.errors import invalid
from pipeline.requests import ChatRequest, JsonObject, Message, Role
from stages.messages import Parsed, PrepareJob, PrepKind
from stages.model import Tokenizer


@attrs.define
class ChatStage:
    _inbox: MemoryObjectReceiveStream[Parsed] = attrs.field(alias="inbox")
    _out: MemoryObjectSendStream[PrepareJob] = attrs.field(alias="out")
    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._inbox, self._out:
            task_status.started()
            async for parsed in self._inbox:
                await self._on_parsed(parsed)

    async def _on_parsed(self, parsed: Parsed) -> None:
        request = parsed.request
        if parsed.reply.closed or not isinstance(request, ChatRequest):
            return
        job = PrepareJob(
            request_id=parsed.request_id,
            kind=PrepKind.TOKENIZE,
            tokenize=partial(render_chat, self._tokenizer, request),
            request=request,
            params=request.params,
            reply=parsed.reply,
            timeline=parsed.timeline,
        )
        await self._out.send(job)


def render_chat(tokenizer: Tokenizer, request: ChatRequest) -> list[int]:
    """Prompt tokens for a chat request, through the model's own template.

    Raises:
        RequestError: the template refused the conversation.
    """
    messages = [_template_message(message) for message in request.messages]
    try:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **request.template_kwargs
        )
    except jinja2.TemplateError as error:
        raise invalid(f"The model's chat template rejected the messages: {error}", param="messages") from None


def _template_message(message: Message) -> JsonObject:
    # Most chat templates predate the "developer" role; it means "system".
    role = Role.SYSTEM if message.role is Role.DEVELOPER else message.role
    rendered: JsonObject = {"role": role.value, "content": message.content}
    if message.name is not None:
        rendered["name"] = message.name
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered
