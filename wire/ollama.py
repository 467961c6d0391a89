"""Ollama's `/api/chat` and `/api/generate` replies: the stream protocol, whole bodies and errors.

A stream is newline-delimited JSON: one object per run of output (`message.content`,
`message.thinking` or `message.tool_calls` for chat; `response` or `thinking` for generate), each
`"done": false`, then one `"done": true` object with `done_reason` and the counts and durations
(nanoseconds): `total_duration` from the request's arrival, `prompt_eval_duration` from its
acceptance to its first output, `eval_duration` from there to the end. A whole reply is that last
object with the output joined in. A tool call's `function.arguments` is an object, sent whole once
the call ends. An error is `{"error": "..."}`, as a body or as a stream's last line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import attrs

from pipeline.errors import ErrorKind, RequestError
from pipeline.events import (
    CompletionEvent,
    FinishReason,
    ReasoningDelta,
    Summary,
    TextDelta,
    ToolCall,
    content_runs,
)
from pipeline.requests import JsonObject, JsonValue
from wire.partial_json import arguments_object

Clock = Callable[[], int]
# Ollama answers a full queue with 503 ("server busy"), not 429.
_STATUS = {ErrorKind.OVERLOADED: 503}
_DONE_REASONS = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.TOOL_CALLS: "stop"}


def error_status(error: RequestError) -> int:
    return _STATUS.get(error.kind, error.status)


def error_body(error: RequestError) -> JsonObject:
    return {"error": error.message}


def line(body: JsonValue) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def created_at(nanoseconds: int) -> str:
    """RFC 3339 in UTC with the nanoseconds, as Ollama writes `created_at`."""
    seconds, nanos = divmod(nanoseconds, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


def tool_calls(calls: Sequence[ToolCall]) -> list[JsonValue]:
    return [
        {
            "id": call.id,
            "function": {"index": call.index, "name": call.name, "arguments": arguments_object(call.arguments)},
        }
        for call in calls
    ]


@attrs.define(kw_only=True)
class OllamaStream:
    """Chat (`chat=True`: output in `message`) or generate (output in `response` and `thinking`).

    `arrived_ns` is when the route received the request, on `clock` (nanoseconds since the epoch).
    """

    model: str
    chat: bool
    arrived_ns: int
    load_ns: int = 0
    clock: Clock = time.time_ns
    _accepted_ns: int = attrs.field(init=False)
    _first_ns: int | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._accepted_ns = self.clock()

    def start(self) -> bytes:
        return b""

    def keepalive(self) -> bytes:
        # NDJSON has no comment line, and the clients parse every line they read.
        return b""

    def add_events(self, events: Sequence[CompletionEvent]) -> bytes:
        runs = content_runs(events)
        if runs and self._first_ns is None:
            self._first_ns = self.clock()
        return b"".join(line(self._object(self._output([run]), done=False)) for run in runs)

    def finish(self, summary: Summary) -> bytes:
        return line(self.body([], summary))

    def error(self, error: RequestError) -> bytes:
        return line(error_body(error))

    def body(self, events: Sequence[CompletionEvent], summary: Summary) -> JsonObject:
        now = self.clock()
        # A whole reply saw no first output: its prefill is counted in eval_duration.
        first = self._first_ns if self._first_ns is not None else self._accepted_ns
        usage = summary.usage
        return self._object(self._output(content_runs(events)), done=True, at=now) | {
            "done_reason": _DONE_REASONS[summary.finish_reason],
            "total_duration": max(0, now - self.arrived_ns),
            "load_duration": self.load_ns,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": max(0, first - self._accepted_ns),
            "eval_count": usage.completion_tokens,
            "eval_duration": max(0, now - first),
        }

    def _object(self, output: JsonObject, *, done: bool, at: int | None = None) -> JsonObject:
        stamp = created_at(self.clock() if at is None else at)
        return {"model": self.model, "created_at": stamp, **output, "done": done}

    def _output(self, runs: Sequence[TextDelta | ReasoningDelta | ToolCall]) -> JsonObject:
        text = "".join(run.text for run in runs if isinstance(run, TextDelta))
        thinking = "".join(run.text for run in runs if isinstance(run, ReasoningDelta))
        calls = [run for run in runs if isinstance(run, ToolCall)]
        if not self.chat:
            return {"response": text, **({"thinking": thinking} if thinking else {})}
        message: JsonObject = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = tool_calls(calls)
        return {"message": message}


def load_reply(model: str, *, unloaded: bool, clock: Clock = time.time_ns) -> JsonObject:
    """A generate (or chat) with nothing to generate: the model was loaded, or unloaded (`keep_alive: 0`)."""
    reply: JsonObject = {"model": model, "created_at": created_at(clock()), "response": "", "done": True}
    return reply | {"done_reason": "unload" if unloaded else "load"}
