"""Chat requests: messages → a tokenizing job for the preparation executor.

The parse stage calls `ChatJobs` with each parsed `ChatRequest`; the job's
`tokenize` renders the model's chat template (after context edits, or cut to
the window under `truncation: "auto"`) in a preparation thread, or on the loop
for a conversation small enough that the thread's hand-off would cost more
(`renders_at_once`); a template that rejects the messages fails that reply (400).
Owns: the tokenizer reference (read-only; a render may run in a worker thread).
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

    def render(
        self,
        tokenizer: Tokenizer,
        request: ChatRequest,
        *,
        preamble: Family | None = None,
        think: tuple[str, str] | None = None,
    ) -> Rendered: ...


@attrs.frozen
class ChatJobs:
    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")
    # Set where the template ignores `tools`: they are described in a system preamble instead.
    _preamble: Family | None = attrs.field(default=None, alias="preamble")
    # The most prompt tokens a request may have (`truncation: "auto"` cuts a conversation to it).
    _room: Callable[[GenerationParams], int] | None = attrs.field(default=None, alias="room")
    # A vision-language model's image side; None: the model reads text only, and an image is a 400.
    _vision: ImageRenderer | None = attrs.field(default=None, alias="vision")
    # The family's think markers (start, end): the render says whether its generation prompt opened a think block.
    _think: tuple[str, str] | None = attrs.field(default=None, alias="think")

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
            inline=renders_at_once(request),
        )

    def _renderer(self, request: ChatRequest) -> Callable[[], list[int] | PromptText | Rendered]:
        parts = self._vision is not None
        images = [image for message in request.messages for image in message.images]
        if images:
            if self._vision is None:
                message = f"The image at '{images[0].param}' cannot be read: the served model takes text only"
                raise invalid(message, param=images[0].param, code="image_input_unsupported")
            return partial(self._vision.render, self._tokenizer, request, preamble=self._preamble, think=self._think)
        preamble, think = self._preamble, self._think
        if request.context_edits:
            return partial(render_edited, self._tokenizer, request, preamble=preamble, parts=parts, think=think)
        if request.truncate_to_fit and self._room is not None:
            room = self._room(request.params)
            return partial(render_fitted, self._tokenizer, request, room, preamble=preamble, parts=parts, think=think)
        return partial(render_chat_text, self._tokenizer, request, preamble=preamble, parts=parts, think=think)


# A conversation this small renders on the loop: SmolLM2's template takes about 0.1 ms for a short message on the
# 2-core build machine, where handing it to a thread and back cost the front about 0.25 ms of CPU and two wakes.
_AT_ONCE_CHARS = 2_048
_AT_ONCE_MESSAGES = 8


def renders_at_once(request: ChatRequest) -> bool:
    """Whether `request`'s template is cheaper to render on the loop than on a preparation thread: a few short
    messages of text, with no tools, images, calls, edits, cut to fit or template arguments (the client's own
    values, of any size), which can make a render long."""
    if request.tools or request.context_edits or request.truncate_to_fit or request.template_kwargs:
        return False
    if len(request.messages) > _AT_ONCE_MESSAGES:
        return False
    chars = 0
    for message in request.messages:
        if message.images or message.tool_calls:
            return False
        chars += len(message.content) + len(message.reasoning or "")
    return chars <= _AT_ONCE_CHARS


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
    tokenizer: Tokenizer,
    request: ChatRequest,
    *,
    preamble: Family | None = None,
    parts: bool = False,
    think: tuple[str, str] | None = None,
) -> PromptText:
    """A chat request's prompt text, through the model's own template.

    With `preamble` (the template ignores `tools`), the tools and the way
    to call them in that family's markup are described in a system message,
    and earlier calls and results are written as text the template renders.
    With `parts` (a vision-language model's template) each message's content
    is a list of parts, an `{"type": "image"}` where each image sits.
    With `think` (the family's think markers), the text says whether the
    reply starts inside a think block (`opens_reasoning`).

    Raises:
        RequestError: the template refused the conversation.
    """
    messages, kwargs = _template_input(request, preamble, parts)
    text = _apply_template(tokenizer, messages, kwargs)
    opened = think is not None and _opens_think(tokenizer, messages, kwargs, text, think)
    # The template writes any BOS itself.
    return PromptText(text, add_special_tokens=False, opens_reasoning=opened)


def _template_input(
    request: ChatRequest, preamble: Family | None, parts: bool
) -> tuple[list[JsonObject], dict[str, JsonValue]]:
    """The messages and keyword arguments the chat template renders `request` from."""
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
    return messages, kwargs


def _apply_template(tokenizer: Tokenizer, messages: list[JsonObject], kwargs: dict[str, JsonValue]) -> str:
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
    return text


def _opens_think(
    tokenizer: Tokenizer, messages: list[JsonObject], kwargs: dict[str, JsonValue], text: str, think: tuple[str, str]
) -> bool:
    """Whether the model's turn, at the end of `text`, is inside a think block it did not close.

    The turn is the generation prompt the template appended (`enable_thinking`, `thinking`, DeepSeek-R1's
    `<think>`): the text beyond the same messages rendered without it, so a think tag in the user's own words is
    not taken for one. A continued final message is the model's own turn, which the whole text ends in.
    """
    start, end = think
    if text.rfind(start) <= text.rfind(end):
        # Nothing is open at the end (the common case): no second render.
        return False
    if not kwargs.get("add_generation_prompt"):
        return True
    before = _apply_template(tokenizer, messages, {**kwargs, "add_generation_prompt": False})
    # A template whose conversation renders otherwise without the prompt: the whole text's end is all there is.
    generation = text[len(before) :] if text.startswith(before) else text
    return generation.rfind(start) > generation.rfind(end)


def render_edited(
    tokenizer: Tokenizer,
    request: ChatRequest,
    *,
    preamble: Family | None = None,
    parts: bool = False,
    think: tuple[str, str] | None = None,
) -> Rendered:
    """Prompt tokens for `request` after its context edits, and what they removed.

    Raises:
        RequestError: the template refused the conversation.
    """
    renders = _Renders(tokenizer, preamble, parts)
    edited = apply_edits(request, lambda candidate: len(renders.tokens(candidate)))
    # The edited conversation was rendered to count it: keep that render.
    chosen = next(render for render in reversed(renders.made) if render.request is edited.request)
    return Rendered(
        tokens=chosen.tokens,
        applied_edits=edited.applied,
        # The first render is the conversation as the client sent it.
        original_tokens=len(renders.made[0].tokens),
        opens_reasoning=renders.opens_reasoning(chosen, think),
    )


def render_fitted(
    tokenizer: Tokenizer,
    request: ChatRequest,
    room: int,
    *,
    preamble: Family | None = None,
    parts: bool = False,
    think: tuple[str, str] | None = None,
) -> Rendered:
    """Prompt tokens for `request` cut to `room` under `truncation: "auto"` (`truncation.py`).

    Raises:
        RequestError: the template refused the conversation.
    """
    renders = _Renders(tokenizer, preamble, parts)
    tokens = render_truncated(renders.tokens, request, room)
    # The cut that fits was rendered to count it: its text says how the model's turn opens.
    chosen = next(render for render in reversed(renders.made) if render.tokens is tokens)
    return Rendered(tokens=tokens, opens_reasoning=renders.opens_reasoning(chosen, think))


@attrs.frozen
class _Render:
    request: ChatRequest
    messages: list[JsonObject]
    kwargs: dict[str, JsonValue]
    text: str
    tokens: list[int]


@attrs.define
class _Renders:
    """The candidates an edit or a cut rendered to count them, kept so the one chosen is never rendered again."""

    tokenizer: Tokenizer
    preamble: Family | None
    parts: bool
    made: list[_Render] = attrs.field(factory=list)

    def tokens(self, candidate: ChatRequest) -> list[int]:
        messages, kwargs = _template_input(candidate, self.preamble, self.parts)
        text = _apply_template(self.tokenizer, messages, kwargs)
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        self.made.append(_Render(candidate, messages, kwargs, text, tokens))
        return tokens

    def opens_reasoning(self, render: _Render, think: tuple[str, str] | None) -> bool:
        """`render_chat_text`'s `opens_reasoning` for one of these renders (made without `think`)."""
        return think is not None and _opens_think(self.tokenizer, render.messages, render.kwargs, render.text, think)


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
