"""OpenAI Responses: the stream protocol and the response object.

`ResponsesStream` satisfies `pipeline.protocol.StreamProtocol`. A stream
is `response.created` → `response.in_progress`, then per output item
`response.output_item.added` … `response.output_item.done` (a `message`
with one `output_text` part, a `reasoning` item, or a `function_call`),
then `response.completed`, or `response.incomplete` when max tokens cut
it short; every event has a `sequence_number`. A failure after the stream
began ends with `response.failed`. `final` is the finished response
object, which the app stores for `previous_response_id`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import attrs

from pipeline.errors import RequestError
from pipeline.events import (
    CompletionEvent,
    FinishReason,
    ReasoningDelta,
    StreamRun,
    Summary,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
    stream_runs,
)
from pipeline.protocol import StreamEvent
from pipeline.requests import JsonObject, JsonValue
from wire.responses_tools import ToolSpec, custom_input, custom_input_so_far
from wire.sse import DataSplice, comment, dumps, sse

Specs = Mapping[str, ToolSpec]


def usage_body(usage: Usage) -> JsonObject:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def output_items(
    events: Sequence[CompletionEvent], *, cut: bool = False, specs: Specs | None = None, grammar_call: str | None = None
) -> list[JsonObject]:
    """The finished `output` of a whole response; with `cut`, its last item was cut short.

    `specs` says which tool names are custom or namespaced; with
    `grammar_call`, the output text is that custom tool's input.
    """
    items: list[_Item] = []
    for event in _content(events):
        _add(items, event, specs or {}, grammar_call)
    return [item.done(cut=cut and index == len(items) - 1) for index, item in enumerate(items)]


def output_text(output: Sequence[JsonValue]) -> str:
    """The SDK's `output_text` convenience: every output_text part, joined."""
    texts = []
    for item in output:
        content = item.get("content") if isinstance(item, dict) and item.get("type") == "message" else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and part.get("type") == "output_text":
                texts.append(str(part.get("text", "")))
    return "".join(texts)


@attrs.define
class _Item:
    """One output item being built: a run of text or reasoning, or one call."""

    kind: str
    id: str
    text: str = ""
    call: ToolCall | None = None
    spec: ToolSpec | None = None

    @property
    def custom(self) -> bool:
        return self.spec is not None and self.spec.kind == "custom"

    @property
    def is_call(self) -> bool:
        return self.call is not None or self.kind == "custom_tool_call"

    def input(self) -> str:
        """A custom call's input: the model's argument, or the text it wrote under the tool's grammar."""
        return custom_input(self.call.arguments) if self.call is not None else self.text

    def part(self) -> JsonObject:
        return _text_part(self.text) if self.kind == "message" else {"type": "reasoning_text", "text": self.text}

    def shown(self, status: str) -> JsonObject:
        finished = status != "in_progress"
        if self.is_call:
            return self._call(finished, status)
        content: list[JsonValue] = [self.part()] if finished else []
        if self.kind == "message":
            return {"type": "message", "id": self.id, "role": "assistant", "status": status, "content": content}
        return {"type": "reasoning", "id": self.id, "summary": [], "content": content, "status": status}

    def done(self, *, cut: bool = False) -> JsonObject:
        return self.shown("incomplete" if cut else "completed")

    def _call(self, finished: bool, status: str) -> JsonObject:
        spec = self.spec
        call_id = self.call.id if self.call is not None else "call_" + self.id.removeprefix("ctc_")
        name = spec.name if spec is not None else self.call.name if self.call is not None else ""
        shown: JsonObject = {"id": self.id, "call_id": call_id, "name": name}
        if self.custom:
            shown = {"type": "custom_tool_call", **shown, "input": self.input() if finished else ""}
        else:
            assert self.call is not None
            shown = {"type": "function_call", **shown, "arguments": self.call.arguments if finished else ""}
        if spec is not None and spec.namespace is not None:
            shown["namespace"] = spec.namespace
        return {**shown, "status": status}


def _add(
    items: list[_Item], event: TextDelta | ReasoningDelta | ToolCall, specs: Specs, grammar_call: str | None
) -> bool:
    """Add `event` to the last item or a new one; True if it opened one."""
    if isinstance(event, ToolCall):
        spec = specs.get(event.name)
        prefix = "ctc" if spec is not None and spec.kind == "custom" else "fc"
        items.append(_Item(kind="function_call", id=f"{prefix}_{uuid.uuid4().hex}", call=event, spec=spec))
        return True
    if grammar_call is not None and isinstance(event, TextDelta):
        # The whole answer is the forced custom tool's input.
        if items and items[-1].kind == "custom_tool_call":
            items[-1].text += event.text
            return False
        items.append(
            _Item(kind="custom_tool_call", id=f"ctc_{uuid.uuid4().hex}", text=event.text, spec=specs[grammar_call])
        )
        return True
    kind = "reasoning" if isinstance(event, ReasoningDelta) else "message"
    if items and items[-1].kind == kind:
        items[-1].text += event.text
        return False
    prefix = "rs" if kind == "reasoning" else "msg"
    items.append(_Item(kind=kind, id=f"{prefix}_{uuid.uuid4().hex}", text=event.text))
    return True


@attrs.define(kw_only=True)
class ResponsesStream:
    id: str
    created_at: int
    model: str
    # The request fields a response object repeats.
    echo: JsonObject
    instructions: str | None
    previous_response_id: str | None
    store: bool
    # Custom and namespaced tools by offered name; the forced grammar-bound custom tool.
    tool_specs: Specs = attrs.field(factory=dict)
    grammar_call: str | None = None
    # `background: true`: the stream starts `queued` and says `in_progress` when `running()` is called.
    background: bool = False
    final: JsonObject | None = attrs.field(default=None, init=False)
    _sequence: int = attrs.field(default=0, init=False)
    _items: list[_Item] = attrs.field(factory=list, init=False)
    # The open item's text-delta data, built on its first delta (wire/sse.DataSplice): per token only the
    # sequence number and the text change.
    _text_frames: dict[tuple[int, bool], DataSplice] = attrs.field(factory=dict, init=False)

    def start(self) -> bytes:
        return sse(self.start_events())

    def add_events(self, events: Sequence[CompletionEvent]) -> bytes:
        return sse(self.output_events(events))

    def finish(self, summary: Summary) -> bytes:
        return sse(self.finish_events(summary))

    def error(self, error: RequestError) -> bytes:
        return sse(self.error_events(error))

    def start_events(self) -> list[StreamEvent]:
        if self.background:
            queued = self._response("queued", output=[])
            return [self._event("response.created", response=queued), self._event("response.queued", response=queued)]
        return [self._event("response.created", response=self.snapshot()), self._running()]

    def snapshot(self, status: str = "in_progress") -> JsonObject:
        """The response object as it stands, before any output: what `response.created` carries."""
        return self._response(status, output=[])

    def running(self) -> bytes:
        """`response.in_progress`: a background response's row has started."""
        return sse([self._running()])

    def _running(self) -> StreamEvent:
        return self._event("response.in_progress", response=self.snapshot())

    def cancel(self) -> bytes:
        """Ends the stream where it stands: the open item closed as cut, `final` the `cancelled` response."""
        closing = self._close(len(self._items) - 1, cut=True) if self._items else []
        last = len(self._items) - 1
        self.final = self._response(
            "cancelled", output=[item.done(cut=i == last) for i, item in enumerate(self._items)]
        )
        return sse(closing)

    def output_events(self, events: Sequence[CompletionEvent]) -> list[StreamEvent]:
        return [event for run in stream_runs(events, join=False) for event in self._on_run(run)]

    def finish_events(self, summary: Summary) -> list[StreamEvent]:
        cut = summary.finish_reason is FinishReason.LENGTH
        closing = self._close(len(self._items) - 1, cut=cut) if self._items else []
        last = len(self._items) - 1
        self.final = self._finished(summary, [item.done(cut=cut and i == last) for i, item in enumerate(self._items)])
        name = "response.completed" if self.final["status"] == "completed" else "response.incomplete"
        return [*closing, self._event(name, response=self.final)]

    def keepalive(self) -> bytes:
        return comment("keepalive")

    def error_events(self, error: RequestError) -> list[StreamEvent]:
        failed = self._response("failed", output=[])
        failed["error"] = {"code": "server_error", "message": error.message}
        self.final = failed
        return [self._event("response.failed", response=failed)]

    def body(self, events: Sequence[CompletionEvent], summary: Summary) -> JsonObject:
        cut = summary.finish_reason is FinishReason.LENGTH
        self.final = self._finished(
            summary, output_items(events, cut=cut, specs=self.tool_specs, grammar_call=self.grammar_call)
        )
        return self.final

    def _finished(self, summary: Summary, output: list[JsonObject]) -> JsonObject:
        cut = summary.finish_reason is FinishReason.LENGTH
        response = self._response("incomplete" if cut else "completed", output=output)
        response["usage"] = usage_body(summary.usage)
        if cut:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response

    def _response(self, status: str, *, output: list[JsonObject]) -> JsonObject:
        items: list[JsonValue] = list(output)
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": self.instructions,
            "model": self.model,
            "output": items,
            "output_text": output_text(items),
            "previous_response_id": self.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": self.store,
            "background": self.background,
            "text": {"format": {"type": "text"}},
            # No `usage` until there is some (OpenAI's schema has it an object, and leaves it out of
            # response.created / in_progress).
            **self.echo,
        }

    def _on_run(self, run: StreamRun) -> list[StreamEvent]:
        last = self._items[-1] if self._items else None
        started = last is not None and last.call is not None and last.call.id == getattr(run, "id", None)
        if isinstance(run, ToolCallStart):
            return self._on_event(ToolCall(index=run.index, id=run.id, name=run.name, arguments=""))
        if isinstance(run, ToolCallDelta) and last is not None and last.call is not None:
            return self._arguments_delta(last, last.call.arguments + run.arguments)
        if isinstance(run, ToolCall) and started and last is not None:
            # The call streamed: it ends when the next item opens or the response does.
            return self._arguments_delta(last, run.arguments)
        return [] if isinstance(run, ToolCallDelta) else self._on_event(run)

    def _arguments_delta(self, item: _Item, arguments: str) -> list[StreamEvent]:
        """The piece that `arguments` adds to the open call: of the input, for a custom tool."""
        assert item.call is not None
        before, item.call = item.call, attrs.evolve(item.call, arguments=arguments)
        index = len(self._items) - 1
        if item.custom:
            piece = custom_input_so_far(arguments)[len(custom_input_so_far(before.arguments)) :]
            name = "response.custom_tool_call_input.delta"
        else:
            piece, name = arguments[len(before.arguments) :], "response.function_call_arguments.delta"
        return [self._event(name, item_id=item.id, output_index=index, delta=piece)] if piece else []

    def _on_event(self, event: TextDelta | ReasoningDelta | ToolCall) -> list[StreamEvent]:
        frames: list[StreamEvent] = []
        if _add(self._items, event, self.tool_specs, self.grammar_call):
            frames += self._close(len(self._items) - 2) if len(self._items) > 1 else []
            frames += self._open(len(self._items) - 1)
        index = len(self._items) - 1
        item = self._items[index]
        item_id = item.id
        if isinstance(event, ToolCall) and not event.arguments:
            return frames  # a call that streams: its arguments follow in pieces
        if item.custom:
            text = item.input() if isinstance(event, ToolCall) else event.text
            delta = self._event(
                "response.custom_tool_call_input.delta", item_id=item_id, output_index=index, delta=text
            )
        elif isinstance(event, ToolCall):
            delta = self._event(
                "response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=event.arguments
            )
        else:
            delta = self._text_delta(item_id, index, event)
        frames.append(delta)
        return frames

    def _text_delta(self, item_id: str, index: int, event: TextDelta | ReasoningDelta) -> StreamEvent:
        reasoning = isinstance(event, ReasoningDelta)
        if (template := self._text_frames.get((index, reasoning))) is None:
            name = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
            extra: JsonObject = {} if reasoning else {"logprobs": []}

            def build(sequence: str, text: str) -> JsonValue:
                return {
                    "type": name,
                    "sequence_number": sequence,
                    "item_id": item_id,
                    "output_index": index,
                    "content_index": 0,
                    "delta": text,
                    **extra,
                }

            template = self._text_frames[index, reasoning] = DataSplice.of(build, holes=2)
        self._sequence += 1
        name = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
        return StreamEvent(name, template.fill(self._sequence - 1, event.text))

    def _open(self, index: int) -> list[StreamEvent]:
        item = self._items[index]
        self._text_frames.clear()
        frames = [self._event("response.output_item.added", output_index=index, item=item.shown("in_progress"))]
        if not item.is_call:
            empty = _Item(kind=item.kind, id=item.id).part()
            frames.append(
                self._event(
                    "response.content_part.added", item_id=item.id, output_index=index, content_index=0, part=empty
                )
            )
        return frames

    def _close(self, index: int, *, cut: bool = False) -> list[StreamEvent]:
        item = self._items[index]
        at: JsonObject = {"item_id": item.id, "output_index": index}
        if item.custom:
            frames = [self._event("response.custom_tool_call_input.done", **at, input=item.input())]
        elif item.call is not None:
            name = item.spec.name if item.spec is not None else item.call.name
            frames = [
                self._event("response.function_call_arguments.done", **at, name=name, arguments=item.call.arguments)
            ]
        else:
            done_type = "response.output_text.done" if item.kind == "message" else "response.reasoning_text.done"
            extra: JsonObject = {"logprobs": []} if item.kind == "message" else {}
            frames = [
                self._event(done_type, **at, content_index=0, text=item.text, **extra),
                self._event("response.content_part.done", **at, content_index=0, part=item.part()),
            ]
        frames.append(self._event("response.output_item.done", output_index=index, item=item.done(cut=cut)))
        return frames

    def _event(self, event_type: str, **data: JsonValue) -> StreamEvent:
        payload: JsonObject = {"type": event_type, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return StreamEvent(event_type, dumps(payload))


def _content(events: Sequence[CompletionEvent]) -> list[TextDelta | ReasoningDelta | ToolCall]:
    """The events that make output items; Responses logprobs are not served."""
    return [e for e in events if isinstance(e, ToolCall) or (isinstance(e, (TextDelta, ReasoningDelta)) and e.text)]


def _text_part(text: str) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
