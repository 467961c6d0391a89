"""Preparation executor: CPU work off the event loop, bounded per kind.

Inbox: `PrepareJob` from the parse stage (a chat or text request's job).
Outbox: `Prepared` to the generation gateway.
Owns: one reservation (semaphore + thread limiter) per `PrepKind`; a job
holds its kind's reservation while its work runs in a worker thread, and
the stage stops taking jobs while every reservation of that kind is held.
A long prompt is tokenized in pieces (`stages/prompt/tokenize.py`); between two
pieces the job hands its reservation back and queues for it again, so one
huge prompt cannot hold the tokenizer while others wait, and it stops as
soon as its count is past the window. A prompt whose byte length alone
proves it cannot fit is refused before any tokenizer work.
On cancel: a job whose reply closed is skipped before and after its work.
On error: each job is isolated (`pipeline/actor.py`): a `RequestError`
(bad template, empty prompt, context overflow, a row longer than the
memory budget admits, logit bias outside the vocabulary, an invalid
structured-output grammar) fails that reply with its 4xx, anything else
with 500; the stage carries on. Grammars compile under their own
reservation (`PrepKind.CONSTRAIN`), after tokenizing, and large ones under
another (`PrepKind.CONSTRAIN_LARGE`) so that they never starve small ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.actor import isolated, serve_items
from pipeline.errors import RequestError, invalid
from pipeline.requests import Accepted, ChatRequest, GenerationParams
from pipeline.tracing import Mark
from stages.messages import CompiledConstraint, Prepared, PrepareJob, PrepKind, PromptText, Rendered
from stages.prompt.constraint_choice import needs_constraint
from stages.prompt.constraints import ConstraintCompiler
from stages.prompt.tokenize import BoundedEncoder

log = structlog.get_logger(stage="prepare")

# Ids of the vocabulary quoted at most in an error message.
_QUOTED_IDS = 5
# A piece this short is encoded on the loop: its tokenizer work (tens of microseconds) costs less than a
# worker thread's hand-off there and back, which every request paid (about a tenth of the front's CPU per
# request on a short prompt; docs/benchmarks.md, "A request's own cost in the front").
INLINE_CHARS = 2_048


@attrs.define
class Reservation:
    slots: anyio.Semaphore
    threads: anyio.CapacityLimiter

    @classmethod
    def of(cls, size: int) -> Reservation:
        return cls(anyio.Semaphore(size), anyio.CapacityLimiter(size))


async def encode_bounded(
    encoder: BoundedEncoder, prompt: PromptText, reservation: Reservation, *, at_most: int
) -> list[int] | None:
    """The prompt's tokens, None once there are more than `at_most`.

    Each piece takes the reservation on its own, so jobs queued for it get
    their turn between two pieces of a long prompt. The caller holds none.
    """
    if encoder.min_tokens(prompt) > at_most:
        return None
    tokens: list[int] = []
    for piece in encoder.pieces(prompt):
        if len(piece.text) <= INLINE_CHARS:
            tokens += encoder.encode(piece)
        else:
            async with reservation.slots:
                tokens += await anyio.to_thread.run_sync(encoder.encode, piece, limiter=reservation.threads)
        if len(tokens) > at_most:
            return None
    return tokens


def prompt_room(context_window: int, max_safe_context: int | None, params: GenerationParams) -> int:
    """The most prompt tokens a request can have and still fit the window and the memory budget."""
    limit, wanted = min(context_window, max_safe_context or context_window), params.max_tokens
    # A max_tokens that is clamped to what the window leaves asks for no room of its own.
    if params.clamp_max_tokens:
        wanted = None
    return max(0, limit - 1 if wanted is None else limit - wanted)


@attrs.define
class PrepareStage:
    _inbox: MemoryObjectReceiveStream[PrepareJob] = attrs.field(alias="inbox")
    _out: MemoryObjectSendStream[Prepared] = attrs.field(alias="out")
    _reservations: Mapping[PrepKind, Reservation] = attrs.field(alias="reservations")
    _context_window: int = attrs.field(alias="context_window")
    _vocab_size: int = attrs.field(alias="vocab_size")
    _compiler: ConstraintCompiler = attrs.field(alias="compiler")
    _encoder: BoundedEncoder = attrs.field(alias="encoder")
    # The longest row (prompt + max_tokens) whose KV fits the budget alone; None: the window.
    # Rows are not reserved at this length: the gateway's scheduler accounts what they hold.
    _max_safe_context: int | None = attrs.field(default=None, alias="max_safe_context")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._inbox, self._out, anyio.create_task_group() as jobs:
            task_status.started()
            await serve_items(self._inbox, lambda job: self._on_job(job, jobs), stage="prepare")

    async def _on_job(self, job: PrepareJob, jobs: TaskGroup) -> None:
        reservation = self._reservations[job.kind]
        await reservation.slots.acquire()
        jobs.start_soon(self._work, job, reservation)

    async def _work(self, job: PrepareJob, reservation: Reservation) -> None:
        # A task of its own: isolated here, as serve_items isolates the loop's items.
        with isolated(job.reply, stage="prepare"):
            rendered = await self._tokens(job, reservation)
            tokens = rendered.tokens
            prepared = attrs.evolve(
                self._check(job, tokens), images=rendered.images, opens_reasoning=rendered.opens_reasoning
            )
            if needs_constraint(job.request):
                prepared = attrs.evolve(prepared, constraint=await self._constrain(job))
            accepted = Accepted(request=job.request, prompt_tokens=len(tokens), applied_edits=rendered.applied_edits)
            if not job.reply.accept(accepted):
                return
            log.info(
                "request.prepare",
                **job.reply.log_context,
                prompt_tokens=len(tokens),
                duration=prepared.timeline.between(Mark.PARSED, Mark.PREPARED),
            )
            await self._out.send(prepared)

    async def _tokens(self, job: PrepareJob, reservation: Reservation) -> Rendered:
        """Renders under the slot `_on_job` took, then tokenizes the text in bounded pieces."""
        try:
            # A text prompt's job only checks it, and a small conversation's render costs less than a thread's hand-off.
            prompt = (
                job.tokenize()
                if job.inline
                else await anyio.to_thread.run_sync(job.tokenize, limiter=reservation.threads)
            )
        finally:
            reservation.slots.release()
        if isinstance(prompt, Rendered):
            return prompt
        if not isinstance(prompt, PromptText):
            return Rendered(tokens=prompt)
        at_most = self._room(job)
        tokens = await encode_bounded(self._encoder, prompt, reservation, at_most=at_most)
        if tokens is None:
            # Past the limit: the exact count is not worth the work.
            raise self._refusal(
                job, at_most + 1, None if job.params.clamp_max_tokens else job.params.max_tokens, at_least=True
            ) or invalid("The prompt is too long", param=_prompt_param(job))
        return Rendered(tokens=tokens, opens_reasoning=prompt.opens_reasoning)

    def _room(self, job: PrepareJob) -> int:
        return prompt_room(self._context_window, self._max_safe_context, job.params)

    def _refusal(self, job: PrepareJob, prompt: int, wanted: int | None, *, at_least: bool) -> RequestError | None:
        """The 400 for a prompt (of at least `prompt` tokens if `at_least`) that does not fit the window or the
        budget."""
        window = self._context_window
        safe = min(window, self._max_safe_context or window)
        # The memory budget's limit: a request past it fails here, before any model work.
        budget = f"This server's memory budget admits at most {safe} tokens per request (prompt plus completion)."
        return _past(
            job,
            prompt,
            wanted,
            f"This model's maximum context length is {window} tokens.",
            window,
            "context_length_exceeded",
            at_least=at_least,
        ) or _past(job, prompt, wanted, budget, safe, "context_over_budget", at_least=at_least)

    async def _constrain(self, job: PrepareJob) -> CompiledConstraint | None:
        """The request's grammar, made under the constraint reservation and
        compiled under it, or under the large-grammar one when it is large."""
        small = self._reservations[PrepKind.CONSTRAIN]
        async with small.slots:
            grammar = await anyio.to_thread.run_sync(self._compiler.grammar_for, job.request, limiter=small.threads)
        if grammar is None:
            return None
        reservation = self._reservations.get(PrepKind.CONSTRAIN_LARGE, small) if grammar.large else small
        async with reservation.slots:
            return await anyio.to_thread.run_sync(self._compiler.compile_grammar, grammar, limiter=reservation.threads)

    def _check(self, job: PrepareJob, tokens: list[int]) -> Prepared:
        window, prompt, wanted = self._context_window, len(tokens), job.params.max_tokens
        safe = min(window, self._max_safe_context or window)
        if wanted is not None and job.params.clamp_max_tokens and prompt < safe:
            wanted = min(wanted, safe - prompt)
        if wanted is not None and (limit := job.params.context_limit) is not None and prompt < limit:
            wanted = min(wanted, limit - prompt)
        if prompt == 0:
            raise invalid("The prompt is empty after tokenization", param="prompt")
        # An id past the logits row would crash the model thread, not fail the request.
        self._check_ids(job.params.sampling.logit_bias, "logit_bias")
        self._check_ids(job.params.stop_token_ids, "stop_token_ids")
        refusal = self._refusal(job, prompt, wanted, at_least=False)
        if refusal is not None:
            raise refusal
        return Prepared(
            request_id=job.request_id,
            request=job.request,
            prompt_tokens=tuple(tokens),
            max_tokens=safe - prompt if wanted is None else wanted,
            params=job.params,
            reply=job.reply,
            timeline=job.timeline.stamp(Mark.PREPARED),
        )

    def _check_ids(self, ids: Iterable[int], param: str) -> None:
        outside = sorted(t for t in ids if not 0 <= t < self._vocab_size)
        if outside:
            quoted = ", ".join(map(str, outside[:_QUOTED_IDS])) + (
                f" and {len(outside) - _QUOTED_IDS} more" if len(outside) > _QUOTED_IDS else ""
            )
            raise invalid(
                f"'{param}' token ids [{quoted}] are outside the vocabulary (0..{self._vocab_size - 1})", param=param
            )


def _past(
    job: PrepareJob, prompt: int, wanted: int | None, limit_text: str, limit: int, code: str, *, at_least: bool
) -> RequestError | None:
    """A 400 naming `limit` when the prompt, plus max_tokens if given, does not fit under it."""
    if prompt >= limit or (wanted is not None and prompt + wanted > limit):
        more = "at least " if at_least else ""
        return invalid(
            f"{limit_text} However, you requested {more}{prompt + (wanted or 0)} tokens ({more}{prompt} in the prompt, "
            f"{wanted or 0} for the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens" if wanted is not None else _prompt_param(job),
            code=code,
        )
    return None


def _prompt_param(job: PrepareJob) -> str:
    return "messages" if isinstance(job.request, ChatRequest) else "prompt"
