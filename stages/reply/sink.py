"""Completion sink: token deltas → completion events on each reply.

Inbox: `StepOutputs` from the gateway, one per decode step.
Outbox: each request's `ReplySlot` (never blocks; docs/STYLE.md, "Slow readers"), and an `Abort` on
the gateway's control channel when a stop string ends a row early.
Owns: per-row text state — mlx-lm's streaming detokenizer, the stop-string
matcher, the markup splitter (reasoning and tool calls, `stages/reply/markup.py`; a forced call
cut before its name, `stages/reply/forced.py`),
token counts and the row's timeline — and the per-request
`request.queue` / `request.prefill` / `request.decode` / `request.finish`
log lines.
On cancel: a row whose reader left drops its state at its next delta, or
when the gateway reports it removed (`StepOutputs.removed`), whichever
comes first; the reader's close already sent the gateway its `Abort` (docs/STYLE.md, "Cancellation through scopes").
On error: each row's work is isolated (`pipeline/actor.py`): an exception
while handling one row's tokens fails that reply with 500 (which aborts
its row in the gateway) and drops its state; the other rows carry on.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import attrs
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.actor import call_isolated
from pipeline.events import CompletionEvent, FinishReason, Logprobs, Summary, TokenLogprob, ToolCall, Usage
from pipeline.observe import NullObserver, RequestObserver, RequestRecord
from pipeline.requests import ChatRequest, ToolChoiceMode
from pipeline.tracing import Mark, Timeline
from stages.families import choose_family
from stages.families.base import Family, Splitter
from stages.grammar_faults import grammar_fault
from stages.messages import Abort, Admitted, Prepared, StepOutputs, TokenDelta, TokenScores, send_abort
from stages.models.loading import StreamingDetokenizer, Tokenizer, completion_detokenizer, token_text
from stages.models.mlx_internals import special_token_ids
from stages.reply.forced import ForcedCall
from stages.reply.markup import Markers, MarkupSplitter, Section, markers_for, splitter_for
from stages.stops import StopMatcher, StopResult

log = structlog.get_logger(stage="sink")


@attrs.define
class RowText:
    admitted: Admitted
    detokenizer: StreamingDetokenizer
    stops: StopMatcher
    markup: Splitter
    timeline: Timeline
    # The client wants at most one tool call (`parallel_tool_calls: false`).
    single_call: bool = False
    # Tokens that end the row and are not text: the model's EOS and the request's `stop_token_ids`.
    hidden: frozenset[int] = frozenset()
    # Stop strings count only from this many tokens on (vLLM's `min_tokens`).
    min_tokens: int = 0
    reasoning_tokens: int = 0
    completion_tokens: int = 0
    # The step that brought this row's last token (inter-token latency).
    last_token_at: float | None = None
    # Speculative decoding: the row's accepted and proposed tokens, told with its last token.
    speculated: tuple[int, int] | None = None


@attrs.define
class CompletionSink:
    _inbox: MemoryObjectReceiveStream[StepOutputs] = attrs.field(alias="inbox")
    _aborts: MemoryObjectSendStream[Abort] = attrs.field(alias="aborts")
    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")
    # The model's markup; chosen from the tokenizer when not given.
    _family: Family | None = attrs.field(default=None, alias="family")
    _observer: RequestObserver = attrs.field(factory=NullObserver, alias="observer")
    _rows: dict[str, RowText] = attrs.field(factory=dict, init=False)
    _eos_ids: frozenset[int] = attrs.field(init=False)
    # Special tokens kept out of text under `skip_special_tokens` (the default).
    _special_ids: frozenset[int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._eos_ids = frozenset(self._tokenizer.eos_token_ids)
        if self._family is None:
            self._family = choose_family(self._tokenizer)
        self._special_ids = _skippable(self._tokenizer, self._family)

    @property
    def open_rows(self) -> int:
        """Rows whose text state is held: those admitted and not yet finished or left."""
        return len(self._rows)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._inbox, self._aborts:
            task_status.started()
            async for outputs in self._inbox:
                self._on_step(outputs)

    def _on_step(self, outputs: StepOutputs) -> None:
        for admitted in outputs.admitted:
            self._row_isolated(admitted.prepared, self._on_admitted, admitted)
        for delta in outputs.deltas:
            row = self._rows.get(delta.request_id)
            if row is not None:
                self._row_isolated(row.admitted.prepared, self._on_delta, row, delta, outputs.stepped_at)
        # No delta follows a removed row's last one: its state goes now.
        for request_id in outputs.removed:
            row = self._rows.pop(request_id, None)
            if row is not None:
                self._observer.finished(
                    _record(row, "abort", len(row.admitted.prepared.prompt_tokens), row.admitted.cached_tokens)
                )

    def _row_isolated(self, prepared: Prepared, work: Callable[..., None], *args: object) -> None:
        # Called for every token of every row: a plain call, not a context manager.
        call_isolated(prepared.reply, "sink", work, *args)
        # A row whose reply failed (or left) has no reader for its text.
        if prepared.reply.done:
            self._rows.pop(prepared.request_id, None)

    def _on_admitted(self, admitted: Admitted) -> None:
        prepared = admitted.prepared
        timeline = prepared.timeline.stamp(Mark.ADMITTED, admitted.admitted_at)
        prepared.reply.cached_tokens = admitted.cached_tokens
        self._rows[prepared.request_id] = RowText(
            admitted=admitted,
            detokenizer=completion_detokenizer(self._tokenizer),
            stops=StopMatcher(prepared.params.stop),
            markup=self._markup_for(prepared),
            timeline=timeline,
            single_call=isinstance(prepared.request, ChatRequest) and not prepared.request.parallel_tool_calls,
            hidden=self._eos_ids
            | frozenset(prepared.params.stop_token_ids)
            | (self._special_ids if prepared.params.skip_special_tokens else frozenset()),
            min_tokens=prepared.params.min_tokens,
        )
        log.info("request.queue", **prepared.reply.log_context, duration=timeline.between(Mark.PREPARED, Mark.ADMITTED))

    def _on_delta(self, row: RowText, delta: TokenDelta, stepped_at: float) -> None:
        reply = row.admitted.prepared.reply
        if reply.done:
            return
        if delta.grammar_fault is not None:
            self._grammar_failed(row, delta)
            return
        if row.completion_tokens == 0:
            row.timeline = row.timeline.stamp(Mark.FIRST_TOKEN, stepped_at)
            log.info("request.prefill", **reply.log_context, duration=_span(row, Mark.ADMITTED, Mark.FIRST_TOKEN))
        elif row.last_token_at is not None and delta.new_token_ids:
            gap = (stepped_at - row.last_token_at) / len(delta.new_token_ids)
            for _ in delta.new_token_ids:
                self._observer.token_gap(gap)
        row.last_token_at = stepped_at
        row.speculated = delta.speculated or row.speculated
        row.completion_tokens += len(delta.new_token_ids)
        text = self._detokenize(row, delta)
        if row.completion_tokens > row.min_tokens:
            result = row.stops.feed(text, final=delta.finish is not None)
        else:
            result = StopResult(text=text)
        ended = result.stop is not None or delta.finish is not None
        was_reasoning = row.markup.reasoning
        cut = result.stop is None and delta.finish is FinishReason.LENGTH
        events = row.markup.feed(result.text, final=ended, cut=cut)
        if was_reasoning or row.markup.reasoning:
            row.reasoning_tokens += len(delta.new_token_ids)
        if delta.logprobs is not None:
            events.append(self._logprobs(delta.new_token_ids, delta.logprobs))
        if row.single_call and not ended and any(isinstance(event, ToolCall) for event in events):
            # No parallel calls: the turn ends with its first call.
            send_abort(self._aborts, delta.request_id)
            self._finish(row, events, FinishReason.TOOL_CALLS, stop=None, at=stepped_at)
        elif result.stop is not None:
            if delta.finish is None:
                send_abort(self._aborts, delta.request_id)
            self._finish(row, events, FinishReason.STOP, stop=result.stop, at=stepped_at)
        elif delta.finish is not None:
            self._finish(row, events, delta.finish, stop=None, at=stepped_at)
        elif events and not reply.put(events):
            del self._rows[delta.request_id]

    def _grammar_failed(self, row: RowText, delta: TokenDelta) -> None:
        """The row's grammar failed making this token: its text is not held to the grammar, so none of it goes
        out; the row ends with an error in its API's shape, never `stop` with broken output."""
        prepared = row.admitted.prepared
        if delta.finish is None:
            send_abort(self._aborts, delta.request_id)
        del self._rows[delta.request_id]
        param = prepared.constraint.param if prepared.constraint is not None else "response_format"
        error = grammar_fault(delta.grammar_fault or "", param)
        log.warning(
            "request.grammar_fault",
            **prepared.reply.log_context,
            param=param,
            reason=error.message,
            completion_tokens=row.completion_tokens,
        )
        prepared.reply.fail(error)
        self._observer.finished(_record(row, "abort", len(prepared.prompt_tokens), row.admitted.cached_tokens))

    def _logprobs(self, tokens: tuple[int, ...], scores: tuple[TokenScores, ...]) -> Logprobs:
        chosen = tuple(self._scored(token, logprob) for token, (logprob, _) in zip(tokens, scores, strict=True))
        top = tuple(tuple(self._scored(t, lp) for t, lp in pairs) for _, pairs in scores)
        return Logprobs(chosen=chosen, top=top)

    def _scored(self, token: int, logprob: float) -> TokenLogprob:
        text, raw = token_text(self._tokenizer, token)
        return TokenLogprob(token=text, bytes=raw, logprob=logprob)

    def _markup_for(self, prepared: Prepared) -> Splitter:
        request = prepared.request
        if not isinstance(request, ChatRequest):
            # A raw completion is plain text: nothing in it is markup.
            return MarkupSplitter(Markers())
        parse_tools = bool(request.tools) and request.tool_choice.mode is not ToolChoiceMode.NONE
        forced = request.tool_choice.mode in (ToolChoiceMode.REQUIRED, ToolChoiceMode.NAMED)
        assert self._family is not None
        markers = markers_for(self._family, request.tools, parse_tools=parse_tools, forced=forced)
        # A grammar (a forced call's, or a response format's) writes the answer at once, whatever the prompt opened.
        constrained = forced or prepared.params.constraint is not None
        # The render knew whether the template's generation prompt opened a think block (stages/prompt/chat.py).
        opened = markers.think is not None and prepared.opens_reasoning
        section = Section.REASONING if opened and not constrained else Section.ANSWER
        splitter = splitter_for(self._family, markers, section)
        # A forced call cut before its name is written is still that call (stages/reply/forced.py).
        name = request.forced_tool if parse_tools else None
        return splitter if name is None else ForcedCall(inner=splitter, name=name)

    def _detokenize(self, row: RowText, delta: TokenDelta) -> str:
        detokenizer = row.detokenizer
        for token in delta.new_token_ids:
            if token not in row.hidden:
                detokenizer.add_token(token)
        if delta.finish is not None:
            detokenizer.finalize()
        return detokenizer.last_segment

    def _finish(
        self, row: RowText, events: list[CompletionEvent], reason: FinishReason, *, stop: str | None, at: float
    ) -> None:
        prepared = row.admitted.prepared
        if reason is FinishReason.STOP and stop is None and row.markup.tool_calls:
            reason = FinishReason.TOOL_CALLS
        del self._rows[prepared.request_id]
        usage = Usage(
            prompt_tokens=len(prepared.prompt_tokens),
            completion_tokens=row.completion_tokens,
            cached_tokens=row.admitted.cached_tokens,
            reasoning_tokens=row.reasoning_tokens,
        )
        if events:
            prepared.reply.put(events)
        prepared.reply.finish(Summary(finish_reason=reason, usage=usage, stop_sequence=stop))
        row.timeline = row.timeline.stamp(Mark.FINISHED, at)
        log.info("request.decode", **prepared.reply.log_context, duration=_span(row, Mark.FIRST_TOKEN, Mark.FINISHED))
        log.info(
            "request.finish",
            **prepared.reply.log_context,
            finish_reason=reason.value,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            queue=_span(row, Mark.PREPARED, Mark.ADMITTED),
            prefill=_span(row, Mark.ADMITTED, Mark.FIRST_TOKEN),
            decode=_span(row, Mark.FIRST_TOKEN, Mark.FINISHED),
            total=_span(row, Mark.RECEIVED, Mark.FINISHED),
            **_acceptance(row.speculated),
        )
        # vLLM's reasons: a turn that ended in a tool call stopped.
        vllm_reason = "length" if reason is FinishReason.LENGTH else "stop"
        self._observer.finished(_record(row, vllm_reason, usage.prompt_tokens, usage.cached_tokens))


def _skippable(tokenizer: Tokenizer, family: Family) -> frozenset[int]:
    """The tokenizer's special tokens less the family's markup, which the splitter reads and removes:
    its markers, and any special token its calls are written with (DeepSeek's `<｜tool▁sep｜>`).

    A family that reads its output itself (gpt-oss's messages) sees every token: its
    markers are special tokens, and its splitter lets none of them into text.
    """
    if family.splitter is not None:
        return frozenset()
    markers = [*(family.think or ()), *(marker for call in family.calls for marker in call if marker)]
    markup = " ".join([*markers, *family.leading, *family.dropped, family.trigger or "", family.example])
    return frozenset(token for token in special_token_ids(tokenizer) if tokenizer.decode([token]) not in markup)


def _record(row: RowText, reason: str, prompt_tokens: int, cached_tokens: int) -> RequestRecord:
    return RequestRecord(
        request_id=row.admitted.prepared.request_id,
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=row.completion_tokens,
        cached_tokens=cached_tokens,
        queue=_span(row, Mark.PREPARED, Mark.ADMITTED),
        prefill=_span(row, Mark.ADMITTED, Mark.FIRST_TOKEN),
        decode=_span(row, Mark.FIRST_TOKEN, Mark.FINISHED),
        first_token=_span(row, Mark.RECEIVED, Mark.FIRST_TOKEN),
        total=_span(row, Mark.RECEIVED, Mark.FINISHED),
    )


def _acceptance(speculated: tuple[int, int] | None) -> dict[str, int]:
    """A speculating row's proposed tokens and how many the target accepted, for its finish line."""
    return {} if speculated is None else {"accepted_tokens": speculated[0], "proposed_tokens": speculated[1]}


def _span(row: RowText, start: Mark, end: Mark) -> float | None:
    return row.timeline.between(start, end)
