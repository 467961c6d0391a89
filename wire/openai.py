"""OpenAI Chat Completions and Completions: stream protocols and bodies.

`ChatStream` and `TextStream` satisfy `pipeline.protocol.StreamProtocol`:
they turn completion events into `chat.completion.chunk` /
`text_completion` SSE frames ending in `data: [DONE]`, or into one JSON
body for a non-streaming request. A stream that fails after it began
ends with an `error` frame and `[DONE]`, so clients always see an end.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from pipeline.errors import ErrorKind, RequestError
from pipeline.events import (
    CompletionEvent,
    ReasoningDelta,
    Summary,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
    stream_runs,
)
from pipeline.requests import JsonObject, JsonValue
from wire.logprobs import chat_logprobs, legacy_logprobs
from wire.sse import Splice, comment, frame, raw_frame

_DONE = raw_frame("[DONE]")

_ERROR_TYPES = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    # OpenAI answers a missing or wrong key with this type and code "invalid_api_key".
    ErrorKind.UNAUTHENTICATED: "invalid_request_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.METHOD_NOT_ALLOWED: "invalid_request_error",
    ErrorKind.FORBIDDEN: "permission_error",
    ErrorKind.BODY_TIMEOUT: "invalid_request_error",
    ErrorKind.TOO_LARGE: "invalid_request_error",
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: "invalid_request_error",
    ErrorKind.OVERLOADED: "rate_limit_error",
    ErrorKind.UNAVAILABLE: "server_error",
    ErrorKind.INTERNAL: "server_error",
}


def error_body(error: RequestError) -> JsonObject:
    return {
        "error": {
            "message": error.message,
            "type": _ERROR_TYPES[error.kind],
            "param": error.param,
            "code": error.code,
        }
    }


def usage_body(usage: Usage) -> JsonObject:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def joined_text(events: Sequence[CompletionEvent]) -> str:
    return "".join(event.text for event in events if isinstance(event, TextDelta))


@attrs.define(kw_only=True)
class _OpenAIStream:
    id: str
    created: int
    model: str
    include_usage: bool = False

    object_name = ""
    # The frame of a chunk that carries only new text, built on first use.
    _text_frame: Splice | None = attrs.field(default=None, init=False)

    def _chunk(self, choices: list[JsonValue], usage: JsonValue = None) -> bytes:
        return frame(self._chunk_body(choices, usage))

    def _chunk_body(self, choices: list[JsonValue], usage: JsonValue = None) -> JsonObject:
        chunk: JsonObject = {
            "id": self.id,
            "object": self.object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = usage
        return chunk

    def _text_chunk(self, text: str) -> bytes:
        # Per token the chunk differs in its text alone (the common case, and the hot path).
        if self._text_frame is None:
            self._text_frame = Splice.of(lambda marker: self._chunk_body([self._text_choice(marker)]))
        return self._text_frame.fill(text)

    def _text_choice(self, text: str) -> JsonObject:
        raise NotImplementedError

    def _envelope(self, choice: JsonObject, usage: Usage) -> JsonObject:
        return {
            "id": self.id,
            "object": self.object_name.removesuffix(".chunk"),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage_body(usage),
        }

    def _usage_tail(self, summary: Summary) -> bytes:
        return self._chunk([], usage_body(summary.usage)) if self.include_usage else b""

    def keepalive(self) -> bytes:
        return comment("keepalive")

    def error(self, error: RequestError) -> bytes:
        return frame(error_body(error)) + _DONE


@attrs.define(kw_only=True)
class ChatStream(_OpenAIStream):
    object_name = "chat.completion.chunk"
    # Calls whose start went out: their arguments came in pieces, and their end adds nothing.
    _started: set[int] = attrs.field(factory=set, init=False)

    def start(self) -> bytes:
        return self._chunk([_chat_choice({"role": "assistant", "content": ""})])

    def add_events(self, events: Sequence[CompletionEvent]) -> bytes:
        if all(type(event) is TextDelta for event in events):
            text = joined_text(events)
            return self._text_chunk(text) if text else b""
        deltas = self._deltas(events)
        logprobs = chat_logprobs(events)
        if logprobs is not None and not deltas:
            # Held-back text still reports its tokens' logprobs, in an empty delta.
            deltas = [{}]
        chunks = [_chat_choice(delta) for delta in deltas]
        if logprobs is not None:
            chunks[-1]["logprobs"] = logprobs
        return b"".join(self._chunk([choice]) for choice in chunks)

    def _deltas(self, events: Sequence[CompletionEvent]) -> list[JsonObject]:
        """One delta per run of events of one kind, in order; a call as OpenAI streams one:
        its index, id, type and name with empty arguments, then the arguments in pieces."""
        deltas: list[JsonObject] = []
        for run in stream_runs(events):
            if isinstance(run, TextDelta):
                deltas.append({"content": run.text})
            elif isinstance(run, ReasoningDelta):
                deltas.append(_reasoning(run.text))
            elif isinstance(run, ToolCallStart):
                self._started.add(run.index)
                head: JsonObject = {
                    "index": run.index,
                    "id": run.id,
                    "type": "function",
                    "function": {"name": run.name, "arguments": ""},
                }
                deltas.append({"tool_calls": [head]})
            elif isinstance(run, ToolCallDelta):
                deltas.append({"tool_calls": [{"index": run.index, "function": {"arguments": run.arguments}}]})
            elif run.index not in self._started:
                # A call known only once whole: one piece, a valid stream of its own.
                deltas.append({"tool_calls": [_tool_call(run, streamed=True)]})
        return deltas

    def _text_choice(self, text: str) -> JsonObject:
        return _chat_choice({"content": text})

    def finish(self, summary: Summary) -> bytes:
        last = self._chunk([_chat_choice({}, summary.finish_reason.value)])
        return last + self._usage_tail(summary) + _DONE

    def body(self, events: Sequence[CompletionEvent], summary: Summary) -> JsonObject:
        text = joined_text(events)
        calls: list[JsonValue] = [_tool_call(event) for event in events if isinstance(event, ToolCall)]
        message: JsonObject = {"role": "assistant", "content": text if text or not calls else None, "refusal": None}
        reasoning = "".join(event.text for event in events if isinstance(event, ReasoningDelta))
        if reasoning:
            message.update(_reasoning(reasoning))
        if calls:
            message["tool_calls"] = calls
        choice: JsonObject = {
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs(events),
            "finish_reason": summary.finish_reason.value,
        }
        return self._envelope(choice, summary.usage)


@attrs.define(kw_only=True)
class TextStream(_OpenAIStream):
    object_name = "text_completion"
    # Where the next token starts in the completion text (legacy logprobs' text_offset).
    _offset: int = attrs.field(default=0, init=False)

    def start(self) -> bytes:
        return b""

    def add_events(self, events: Sequence[CompletionEvent]) -> bytes:
        text = joined_text(events)
        logprobs, self._offset = legacy_logprobs(events, self._offset)
        if not text and logprobs is None:
            return b""
        if logprobs is None:
            return self._text_chunk(text)
        choice = _text_choice(text)
        choice["logprobs"] = logprobs
        return self._chunk([choice])

    def _text_choice(self, text: str) -> JsonObject:
        return _text_choice(text)

    def finish(self, summary: Summary) -> bytes:
        return self._chunk([_text_choice("", summary.finish_reason.value)]) + self._usage_tail(summary) + _DONE

    def body(self, events: Sequence[CompletionEvent], summary: Summary) -> JsonObject:
        choice = _text_choice(joined_text(events), summary.finish_reason.value)
        choice["logprobs"] = legacy_logprobs(events, 0)[0]
        return self._envelope(choice, summary.usage)


def _chat_choice(delta: JsonObject, finish_reason: str | None = None) -> JsonObject:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _text_choice(text: str, finish_reason: str | None = None) -> JsonObject:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _reasoning(text: str) -> JsonObject:
    # Clients are split between the two names; send both.
    return {"reasoning_content": text, "reasoning": text}


def _tool_call(call: ToolCall, *, streamed: bool = False) -> JsonObject:
    body: JsonObject = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, **body} if streamed else body
