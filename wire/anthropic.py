"""Anthropic Messages: the stream protocol, response bodies and errors.

`MessagesStream` satisfies `pipeline.protocol.StreamProtocol` with
Anthropic's event grammar: `message_start`, then per content block
`content_block_start` → `content_block_delta`… → `content_block_stop`,
then `message_delta` (stop reason, output tokens) and `message_stop`.
Answer text is a `text` block, reasoning a `thinking` block, each tool
call a `tool_use` block whose input arrives as `input_json_delta`. A
stream that fails after it began ends with an `error` event. A block the
edge made whole (the MCP connector's `mcp_tool_use` and `mcp_tool_result`,
wire/anthropic_mcp.py) goes out with `block`, its input in one delta.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import attrs

from pipeline.errors import ErrorKind, RequestError
from pipeline.events import (
    CompletionEvent,
    FinishReason,
    Logprobs,
    ReasoningDelta,
    Summary,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
    content_runs,
)
from pipeline.requests import JsonObject, JsonValue
from wire.partial_json import arguments_object
from wire.sse import Splice, frame

# Anthropic's status for "overloaded" is its own 529, which clients retry.
_ERRORS = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorKind.UNAUTHENTICATED: (401, "authentication_error"),
    ErrorKind.NOT_FOUND: (404, "not_found_error"),
    ErrorKind.METHOD_NOT_ALLOWED: (405, "invalid_request_error"),
    ErrorKind.FORBIDDEN: (403, "permission_error"),
    ErrorKind.BODY_TIMEOUT: (408, "invalid_request_error"),
    ErrorKind.TOO_LARGE: (413, "request_too_large"),
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: (415, "invalid_request_error"),
    ErrorKind.OVERLOADED: (529, "overloaded_error"),
    ErrorKind.UNAVAILABLE: (529, "overloaded_error"),
    ErrorKind.INTERNAL: (500, "api_error"),
}


def error_status(error: RequestError) -> int:
    return _ERRORS[error.kind][0]


def error_body(error: RequestError) -> JsonObject:
    return {"type": "error", "error": {"type": _ERRORS[error.kind][1], "message": error.message}}


def stop_reason(summary: Summary) -> str:
    if summary.stop_sequence is not None:
        return "stop_sequence"
    return {
        FinishReason.STOP: "end_turn",
        FinishReason.LENGTH: "max_tokens",
        FinishReason.TOOL_CALLS: "tool_use",
    }[summary.finish_reason]


def usage_body(usage: Usage) -> JsonObject:
    # Anthropic counts cache reads apart from input_tokens; the three add up to the prompt.
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


def tool_use_id(call: ToolCall | ToolCallStart) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def content_blocks(events: Sequence[CompletionEvent]) -> list[JsonValue]:
    """The `content` of a whole message: runs of one kind become one block."""
    # Messages has no logprobs; content_runs leaves them out.
    return [
        _tool_use_block(run, arguments=run.arguments)
        if isinstance(run, ToolCall)
        else _open_block(run) | {_block_type(run): run.text}
        for run in content_runs(events)
    ]


@attrs.define(kw_only=True)
class MessagesStream:
    id: str
    model: str
    input_tokens: int
    # The response's `context_management` report, when the request asked for edits.
    context_management: JsonObject | None = None
    # Thinking blocks keep their place but carry no text (`display: "omitted"`).
    omit_thinking: bool = False
    # The prompt tokens the prompt cache held; None until the row is admitted, and message_start waits for it
    # (Anthropic's reports the uncached count and the cache's apart, as message_delta does).
    cached_tokens: Callable[[], int | None] = lambda: 0
    _started: bool = attrs.field(default=False, init=False)
    _index: int = attrs.field(default=-1, init=False)
    _open: str | None = attrs.field(default=None, init=False)
    # The call whose tool_use block is open (its completion index).
    _call: int | None = attrs.field(default=None, init=False)
    # The open block's text-delta frame, built on its first delta (wire/sse.Splice): per token only the text changes.
    _text_frame: Splice | None = attrs.field(default=None, init=False)

    def start(self) -> bytes:
        return self._message_start(waiting=True)

    def keepalive(self) -> bytes:
        return self._message_start(waiting=True) if not self._started else _event("ping", {})

    def add_events(self, events: Sequence[CompletionEvent]) -> bytes:
        return self._message_start(waiting=False) + b"".join(self._on_event(event) for event in events)

    def _message_start(self, *, waiting: bool) -> bytes:
        """message_start then a ping, once the cache's share is known (or output comes).

        Until then an SSE comment keeps the stream alive: no event may come before message_start.
        """
        if self._started:
            return b""
        cached = self.cached_tokens()
        if cached is None and waiting:
            return b": keepalive\n\n"
        self._started = True
        usage = usage_body(Usage(prompt_tokens=self.input_tokens, completion_tokens=0, cached_tokens=cached or 0))
        message = self._message(content=[], stop=None, usage=usage)
        return _event("message_start", {"message": message}) + _event("ping", {})

    def block(self, block: JsonObject) -> bytes:
        """A whole block the edge made: opened, its `input` (if any) in one `input_json_delta`, closed."""
        head = self._message_start(waiting=False) + self._close()
        if "input" not in block:
            return head + self._start(block) + self._close()
        pieces: JsonObject = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        return head + self._start({**block, "input": {}}) + self._delta(pieces) + self._close()

    def finish(self, summary: Summary, reason: str | None = None) -> bytes:
        """The stream's end; `reason` is a stop reason the summary cannot say (the connector's `pause_turn`)."""
        delta: JsonObject = {"stop_reason": reason or stop_reason(summary), "stop_sequence": summary.stop_sequence}
        closing: JsonObject = {"delta": delta, "usage": usage_body(summary.usage)}
        if self.context_management is not None:
            closing["context_management"] = self.context_management
        return (
            self._message_start(waiting=False)
            + self._close()
            + _event("message_delta", closing)
            + _event("message_stop", {})
        )

    def error(self, error: RequestError) -> bytes:
        return frame(error_body(error), event="error")

    def body(self, events: Sequence[CompletionEvent], summary: Summary) -> JsonObject:
        return self.whole(content_blocks(events), summary)

    def whole(self, content: Sequence[JsonValue], summary: Summary, reason: str | None = None) -> JsonObject:
        """The message of `content` blocks; `reason` as `finish` takes it."""
        shown = [_without_thinking(block) for block in content] if self.omit_thinking else list(content)
        message = self._message(content=shown, stop=summary, usage=usage_body(summary.usage))
        if reason is not None:
            message["stop_reason"] = reason
        return message

    def _message(self, *, content: list[JsonValue], stop: Summary | None, usage: JsonObject) -> JsonObject:
        message: JsonObject = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason(stop) if stop else None,
            "stop_sequence": stop.stop_sequence if stop else None,
            "usage": usage,
        }
        if self.context_management is not None:
            message["context_management"] = self.context_management
        return message

    def _on_event(self, event: CompletionEvent) -> bytes:
        if isinstance(event, ToolCallStart):
            return self._close() + self._start(_tool_use_block(event, arguments=None), event.index)
        if isinstance(event, ToolCallDelta):
            return self._delta({"type": "input_json_delta", "partial_json": event.arguments})
        if isinstance(event, ToolCall):
            if self._open == "tool_use" and self._call == event.index:
                return self._close()
            # A call known only once whole: its block opens, takes the input in one piece, and closes.
            head = self._close() + self._start(_tool_use_block(event, arguments=None))
            arguments: JsonObject = {"type": "input_json_delta", "partial_json": event.arguments}
            return head + self._delta(arguments) + self._close()
        if isinstance(event, Logprobs) or not event.text:
            return b""
        kind = _block_type(event)
        head = b"" if self._open == kind else self._close() + self._start(_open_block(event))
        if kind == "thinking" and self.omit_thinking:
            return head
        if self._text_frame is None:
            index = self._index
            self._text_frame = Splice.of(
                lambda text: {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": f"{kind}_delta", kind: text},
                },
                event="content_block_delta",
            )
        return head + self._text_frame.fill(event.text)

    def _start(self, block: JsonObject, call: int | None = None) -> bytes:
        self._index += 1
        self._call = call
        self._open = str(block["type"])
        self._text_frame = None
        return _event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: JsonObject) -> bytes:
        return _event("content_block_delta", {"index": self._index, "delta": delta})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        # A thinking block ends with its signature; this server signs nothing.
        tail = self._delta({"type": "signature_delta", "signature": ""}) if self._open == "thinking" else b""
        self._open = None
        return tail + _event("content_block_stop", {"index": self._index})


def _without_thinking(block: JsonValue) -> JsonValue:
    if isinstance(block, dict) and block.get("type") == "thinking":
        return {**block, "thinking": ""}
    return block


def _event(name: str, data: JsonObject) -> bytes:
    return frame({"type": name, **data}, event=name)


def _block_type(event: TextDelta | ReasoningDelta) -> str:
    return "thinking" if isinstance(event, ReasoningDelta) else "text"


def _open_block(event: TextDelta | ReasoningDelta) -> JsonObject:
    if isinstance(event, ReasoningDelta):
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def _tool_use_block(call: ToolCall | ToolCallStart, *, arguments: str | None) -> JsonObject:
    # A call cut off by max tokens has the input a partial JSON reader makes of it, as the SDK's stream does.
    return {
        "type": "tool_use",
        "id": tool_use_id(call),
        "name": call.name,
        "input": arguments_object(arguments or "{}"),
    }
