"""Chat requests: messages → a tokenizing job for the preparation executor.

The parse stage calls `ChatJobs` with each parsed `ChatRequest`; the job's
`tokenize` renders the model's chat template (after context edits, or cut to
the window under `truncation: "auto"`) in a preparation thread, where a
template that rejects the messages fails that reply (400).
Owns: the tokenizer reference (read-only; rendering runs in a worker thread).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

import attrs
import jinja2

from pipeline.errors import excerpt, invalid
from pipeline.jsontext import loads
from pipeline.requests import (
    ChatRequest,
    GenerationParams,
    JsonObject,
    JsonValue,
    Message,
    Role,
    ToolCallRecord,
    ToolChoiceMode,
)
from stages.families.base import Family
from stages.families.preamble import template_tool, tool_preamble
from stages.messages import Parsed, PrepareJob, PrepKind, PromptText, Rendered
from stages.models.loading import Tokenizer
from stages.prompt.context_edits import apply_edits
from stages.prompt.truncation import render_truncated


class ImageRenderer(Protocol):
    """A vision-language model's prompt side (`stages/prompt/vision_chat.py`'s `VisionPrompt`)."""

    def render(self, tokenizer: Tokenizer, request: ChatRequest, *, preamble: Family | None = None) -> Rendered: ...


@attrs.frozen
class ChatJobs:
    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")
    # Set where the template ignores `tools`: they are described in a system preamble instead.
    _preamble: Family | None = attrs.field(default=None, alias="preamble")
    # The most prompt tokens a request may have (`truncation: "auto"` cuts a conversation to it).
    _room: Callable[[GenerationParams], int] | None = attrs.field(default=None, alias="room")
    # A vision-language model's image side; None: the model reads text only, and an image is a 400.
    _vision: ImageRenderer | None = attrs.field(default=None, alias="vision")

    def job(self, parsed: Parsed, request: ChatRequest) -> PrepareJob:
        """The job that renders and tokenizes `request`'s prompt in a preparation thread."""
        return PrepareJob(
            request_id=parsed.request_id,
            kind=PrepKind.TOKENIZE,
            tokenize=self._renderer(request),
            request=request,
            params=request.params,
            reply=parsed.reply,
            timeline=parsed.timeline,
        )

    def _renderer(self, request: ChatRequest) -> Callable[[], list[int] | PromptText | Rendered]:
        parts = self._vision is not None
        images = [image for message in request.messages for image in message.images]
        if images:
            if self._vision is None:
                message = f"The image at '{images[0].param}' cannot be read: the served model takes text only"
                raise invalid(message, param=images[0].param, code="image_input_unsupported")
            return partial(self._vision.render, self._tokenizer, request, preamble=self._preamble)
        if request.context_edits:
            return partial(render_edited, self._tokenizer, request, preamble=self._preamble, parts=parts)
        if request.truncate_to_fit and self._room is not None:
            render = partial(render_chat, self._tokenizer, preamble=self._preamble, parts=parts)
            return partial(render_truncated, render, request, self._room(request.params))
        return partial(render_chat_text, self._tokenizer, request, preamble=self._preamble, parts=parts)


# Template arguments the server sets itself, or that would swap the model's template.
_RESERVED_KWARGS = frozenset(
    {
        "tokenize",
        "continue_final_message",
        "add_generation_prompt",
        "return_dict",
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "return_tensors",
        "padding",
        "truncation",
        "max_length",
    }
)


def render_chat(
    tokenizer: Tokenizer, request: ChatRequest, *, preamble: Family | None = None, parts: bool = False
) -> list[int]:
    """Prompt tokens for a chat request, through the model's own template, in one piece.

    Raises:
        RequestError: the template refused the conversation.
    """
    text = render_chat_text(tokenizer, request, preamble=preamble, parts=parts).text
    return tokenizer.encode(text, add_special_tokens=False)


def render_chat_text(
    tokenizer: Tokenizer, request: ChatRequest, *, preamble: Family | None = None, parts: bool = False
) -> PromptText:
    """A chat request's prompt text, through the model's own template.

    With `preamble` (the template ignores `tools`), the tools and the way
    to call them in that family's markup are described in a system message,
    and earlier calls and results are written as text the template renders.
    With `parts` (a vision-language model's template) each message's content
    is a list of parts, an `{"type": "image"}` where each image sits.

    Raises:
        RequestError: the template refused the conversation.
    """
    uses_tools = bool(request.tools) and request.tool_choice.mode is not ToolChoiceMode.NONE
    if preamble is not None and (uses_tools or any(m.tool_calls or m.role is Role.TOOL for m in request.messages)):
        messages = tool_preamble(preamble, request.tools if uses_tools else (), request.messages)
    else:
        messages = [_template_message(message) for message in request.messages]
    if parts:
        messages = [as_parts(rendered, message) for rendered, message in zip(messages, _aligned(messages, request))]
    reserved = sorted(_RESERVED_KWARGS.intersection(request.template_kwargs))
    if reserved:
        raise invalid(f"'chat_template_kwargs' may not set {reserved}", param="chat_template_kwargs")
    kwargs: dict[str, JsonValue] = dict(request.template_kwargs)
    if request.tool_choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED):
        # A forced call is written at once, in the answer: no think section opened before it.
        kwargs.setdefault("enable_thinking", False)
    if uses_tools:
        kwargs["tools"] = [template_tool(tool) for tool in request.tools]
    if request.continue_final:
        kwargs.update(add_generation_prompt=False, continue_final_message=True)
    else:
        kwargs.setdefault("add_generation_prompt", True)
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except jinja2.TemplateError as error:
        # The template's own words (raise_exception in the template), bounded.
        raise invalid(
            f"The model's chat template rejected the messages: {excerpt(str(error))}", param="messages"
        ) from None
    except (TypeError, ValueError, ArithmeticError, LookupError):
        # A template that trips over this input: its library's words would mean nothing to the client.
        raise invalid("The model's chat template cannot render these messages", param="messages") from None
    if not isinstance(text, str):
        raise TypeError("the chat template did not render text")
    # The template writes any BOS itself.
    return PromptText(text, add_special_tokens=False)


def render_edited(
    tokenizer: Tokenizer, request: ChatRequest, *, preamble: Family | None = None, parts: bool = False
) -> Rendered:
    """Prompt tokens for `request` after its context edits, and what they removed.

    Raises:
        RequestError: the template refused the conversation.
    """
    renders: list[tuple[ChatRequest, list[int]]] = []

    def count(candidate: ChatRequest) -> int:
        renders.append((candidate, render_chat(tokenizer, candidate, preamble=preamble, parts=parts)))
        return len(renders[-1][1])

    edited = apply_edits(request, count)
    # The edited conversation was rendered to count it: keep that render.
    tokens = next(tokens for candidate, tokens in reversed(renders) if candidate is edited.request)
    # The first render is the conversation as the client sent it.
    return Rendered(tokens=tokens, applied_edits=edited.applied, original_tokens=len(renders[0][1]))


def _template_message(message: Message) -> JsonObject:
    # Most chat templates predate the "developer" role; it means "system".
    role = Role.SYSTEM if message.role is Role.DEVELOPER else message.role
    rendered: JsonObject = {"role": role.value, "content": message.content}
    if message.name is not None:
        rendered["name"] = message.name
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        rendered["tool_calls"] = [_template_call(call) for call in message.tool_calls]
    if message.reasoning:
        # The name Qwen3, DeepSeek and GLM templates read.
        rendered["reasoning_content"] = message.reasoning
    return rendered


def _aligned(messages: list[JsonObject], request: ChatRequest) -> list[Message | None]:
    """The request's message behind each rendered one (a tool preamble may add a system message first)."""
    extra = len(messages) - len(request.messages)
    return [None] * extra + list(request.messages)


def as_parts(rendered: JsonObject, message: Message | None) -> JsonObject:
    """A rendered message with its content as parts: text, and an image part where each image sits."""
    content = rendered.get("content")
    text = content if isinstance(content, str) else ""
    if message is None or not message.images or text != message.content:
        return {**rendered, "content": [{"type": "text", "text": text}]}
    pieces: list[JsonValue] = []
    start = 0
    for image in message.images:
        if image.offset > start:
            pieces.append({"type": "text", "text": text[start : image.offset]})
        pieces.append({"type": "image"})
        start = image.offset
    if start < len(text) or not pieces:
        pieces.append({"type": "text", "text": text[start:]})
    return {**rendered, "content": pieces}


def _template_call(call: ToolCallRecord) -> JsonValue:
    # Templates index into `arguments` or pipe it to tojson: give them an
    # object where the JSON text is one, as mlx_lm.server does.
    try:
        arguments: JsonValue = loads(call.arguments)
    except ValueError:
        arguments = call.arguments
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}
