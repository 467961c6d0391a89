"""Preparation executor: CPU work off the event loop, bounded per kind.

Inbox: `PrepareJob` from the chat and text stages.
Outbox: `Prepared` to the generation gateway.
Owns: one reservation (semaphore + thread limiter) per `PrepKind`; a job
holds its kind's reservation while its work runs in a worker thread, and
the stage stops taking jobs while every reservation of that kind is held.
On cancel: a job whose reply closed is skipped before and after its work.
On error: a `RequestError` from the work (bad template, empty prompt,
context overflow, a row longer than the memory budget admits, logit bias
outside the vocabulary, an invalid structured-output grammar) fails that
reply; the stage carries on. Grammars compile under their own reservation
(`PrepKind.CONSTRAIN`), after tokenizing.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import attrs
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.errors import RequestError, invalid
from pipeline.requests import Accepted, ChatRequest
from pipeline.tracing import Mark
from stages.constraints import CompiledConstraint, ConstraintCompiler, needs_constraint
from stages.messages import Prepared, PrepareJob, PrepKind, Rendered

log = structlog.get_logger(stage="prepare")


@attrs.define
class Reservation:
    slots: anyio.Semaphore
    threads: anyio.CapacityLimiter

    @classmethod
    def of(cls, size: int) -> Reservation:
        return cls(anyio.Semaphore(size), anyio.CapacityLimiter(size))


@attrs.define
class PrepareStage:
    _inbox: MemoryObjectReceiveStream[PrepareJob] = attrs.field(alias="inbox")
    _out: MemoryObjectSendStream[Prepared] = attrs.field(alias="out")
    _reservations: Mapping[PrepKind, Reservation] = attrs.field(alias="reservations")
    _context_window: int = attrs.field(alias="context_window")
    _vocab_size: int = attrs.field(alias="vocab_size")
    _compiler: ConstraintCompiler = attrs.field(alias="compiler")
    # The longest row (prompt + max_tokens) the memory budget admits; None: the window.
    _max_safe_context: int | None = attrs.field(default=None, alias="max_safe_context")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._inbox, self._out, anyio.create_task_group() as jobs:
            task_status.started()
            async for job in self._inbox:
                await self._on_job(job, jobs)

    async def _on_job(self, job: PrepareJob, jobs: TaskGroup) -> None:
        if job.reply.closed:
            return
        reservation = self._reservations[job.kind]
        await reservation.slots.acquire()
        jobs.start_soon(self._work, job, reservation)

    async def _work(self, job: PrepareJob, reservation: Reservation) -> None:
        try:
            rendered = await anyio.to_thread.run_sync(job.tokenize, limiter=reservation.threads)
            tokens, edits = (rendered.tokens, rendered.applied_edits) if isinstance(rendered, Rendered) else (rendered, ())
            prepared = self._check(job, tokens)
        except RequestError as error:
            job.reply.fail(error)
            return
        finally:
            reservation.slots.release()
        if needs_constraint(job.request):
            compiled = await self._constrain(job)
            if compiled is None:
                return
            prepared = attrs.evolve(prepared, constraint=compiled)
        if not job.reply.accept(Accepted(request=job.request, prompt_tokens=len(tokens), applied_edits=edits)):
            return
        log.info(
            "request.prepare",
            **job.reply.log_context,
            prompt_tokens=len(tokens),
            duration=prepared.timeline.between(Mark.PARSED, Mark.PREPARED),
        )
        await self._out.send(prepared)

    async def _constrain(self, job: PrepareJob) -> CompiledConstraint | None:
        """The request's grammar, compiled under the constraint reservation; None if it failed the request."""
        reservation = self._reservations[PrepKind.CONSTRAIN]
        async with reservation.slots:
            try:
                return await anyio.to_thread.run_sync(self._compiler.compile_for, job.request, limiter=reservation.threads)
            except RequestError as error:
                job.reply.fail(error)
                return None

    def _check(self, job: PrepareJob, tokens: list[int]) -> Prepared:
        window, prompt, wanted = self._context_window, len(tokens), job.params.max_tokens
        safe = min(window, self._max_safe_context or window)
        if wanted is not None and job.params.clamp_max_tokens and prompt < safe:
            wanted = min(wanted, safe - prompt)
        if prompt == 0:
            raise invalid("The prompt is empty after tokenization", param="prompt")
        # An id past the logits row would crash the model thread, not fail the request.
        outside = sorted(t for t in job.params.sampling.logit_bias if not 0 <= t < self._vocab_size)
        if outside:
            raise invalid(
                f"'logit_bias' token ids {outside} are outside the vocabulary (0..{self._vocab_size - 1})",
                param="logit_bias",
            )
        _refuse_past(job, prompt, wanted, f"This model's maximum context length is {window} tokens.", window, "context_length_exceeded")
        # The memory budget's limit: a request past it fails here, before any model work.
        budget = f"This server's memory budget admits at most {safe} tokens per request (prompt plus completion)."
        _refuse_past(job, prompt, wanted, budget, safe, "context_over_budget")
        return Prepared(
            request_id=job.request_id,
            request=job.request,
            prompt_tokens=tuple(tokens),
            max_tokens=safe - prompt if wanted is None else wanted,
            params=job.params,
            reply=job.reply,
            timeline=job.timeline.stamp(Mark.PREPARED),
        )


def _refuse_past(job: PrepareJob, prompt: int, wanted: int | None, limit_text: str, limit: int, code: str) -> None:
    """A 400 naming `limit` when the prompt, plus max_tokens if given, does not fit under it."""
    if prompt >= limit or (wanted is not None and prompt + wanted > limit):
        raise invalid(
            f"{limit_text} However, you requested {prompt + (wanted or 0)} tokens ({prompt} in the prompt, "
            f"{wanted or 0} for the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens" if wanted is not None else _prompt_param(job),
            code=code,
        )


def _prompt_param(job: PrepareJob) -> str:
    return "messages" if isinstance(job.request, ChatRequest) else "prompt"
