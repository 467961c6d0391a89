"""The gateway's rows on the model thread: into the batch, out of it, and what each step gave them.

The batch (mlx-lm's `BatchGenerator`, or a generator with its face) runs
the rows; `BatchRows` keeps what the gateway knows of each: the request it
answers, its place in the KV account (`stages/kv/scheduler.py`), its
sampler and processors, and the tokens it has generated. It admits the
waiting rows whose KV fits, preempts under memory pressure (the victims go
back to the head of the queue, rewound; idle rows, a Batch API's lines, go
first, and wait behind every live row), removes aborted rows, and turns a
step's responses into token deltas. What a row holds when it leaves the
batch (finished, aborted or preempted) goes to the prompt cache.
Everything here runs on the model thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import structlog

from pipeline.actor import isolated
from pipeline.errors import RequestError
from pipeline.events import FinishReason
from stages.cache.prompt import PromptCache
from stages.cache.tier import Entry
from stages.kv.scheduler import KvScheduler
from stages.messages import Abort, Admitted, Prepared, TokenDelta
from stages.model_thread.adapter_batches import adapter_kwargs
from stages.model_thread.rows import Failed, Resume, Row, Waiting
from stages.model_thread.vision_rows import VisionRows, keyed

if TYPE_CHECKING:
    from mlx_lm.generate import BatchGenerator

log = structlog.get_logger(stage="gateway")

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


@attrs.define
class BatchRows:
    _kv: KvScheduler = attrs.field(alias="scheduler")
    _eos_ids: frozenset[int] = attrs.field(alias="eos_ids")
    # The think markers as token ids (the start may take several tokens, the end is one): thinking budgets need them.
    _think_ids: tuple[tuple[int, ...], int] | None = attrs.field(alias="think_ids")
    cache: PromptCache | None = None
    # A vision-language model's image side: rows with images are encoded and prefilled before they join.
    vision: VisionRows | None = None
    rows: dict[int, Row] = attrs.field(factory=dict, init=False)
    waiting: list[Waiting] = attrs.field(factory=list, init=False)
    # Rows that failed at admission, for their replies with the step's parcel.
    failed: list[Failed] = attrs.field(factory=list, init=False)
    _uids: dict[str, int] = attrs.field(factory=dict, init=False)

    @property
    def held(self) -> int:
        """Rows in the batch or waiting for it."""
        return len(self.rows) + len(self.waiting)

    def prefilling(self) -> list[Row]:
        """Rows in the batch that have not given a token since they were inserted (a resumed row prefills again)."""
        return [row for row in self.rows.values() if len(row.generated) == len(row.resume.generated)]

    def admit(self, generator: BatchGenerator) -> tuple[Admitted, ...]:
        admitted = []
        # First come, first served: a large row is not overtaken by smaller ones for ever.
        # A row alone always runs: the preparation stage refused any that cannot fit alone.
        self._order_waiting()
        while self.waiting:
            fits = not self.rows or self._kv.can_admit(len(self.waiting[0].tokens))
            if not fits and not self._make_room(generator, self.waiting[0]):
                break
            ready = self._images_ready(self.waiting[0])
            if ready is False:
                break
            waiting = self.waiting.pop(0)
            row = waiting.prepared
            if ready is None:
                continue
            with isolated(row.reply, stage="gateway", fail=partial(self._fail, row)):
                cached = self._insert(generator, waiting)
                # A resumed row was announced once, when it first started.
                if waiting.resume is None:
                    admitted.append(Admitted(prepared=row, admitted_at=time.monotonic(), cached_tokens=cached))
        return tuple(admitted)

    def _images_ready(self, waiting: Waiting) -> bool | None:
        """Whether the row's images are encoded (a tile more each step while other rows decode); None: it failed."""
        row = waiting.prepared
        if not row.images or self.vision is None or not self.rows:
            return True
        outcome = None
        with isolated(row.reply, stage="gateway", fail=partial(self._fail, row)):
            outcome = self.vision.encode_step(row.images)
        if outcome is None:
            self.vision.forget(row.images)
        return outcome

    def _fail(self, row: Prepared, error: RequestError) -> None:
        if row.images and self.vision is not None:
            self.vision.forget(row.images)
        self.failed.append(Failed(row=row, error=error))

    def _insert(self, generator: BatchGenerator, waiting: Waiting) -> int:
        from stages.model_thread.sampling import make_row_sampler, row_processors, row_stop_sequences

        # What can fail for this row alone (cache lookup, sampler, grammar matcher) comes before the generator holds it.
        row, tokens = waiting.prepared, waiting.tokens
        params = row.params
        key = self._key(row, tokens)
        hit = None if self.cache is None else self.cache.fetch(key, session=params.cache_key, adapter=params.adapter)
        cached = hit.tokens if hit is not None else 0
        layers, start = (hit.cache if hit is not None else None), cached
        if row.images and self.vision is not None:
            layers, start = self.vision.prefill(tokens, row.images, cached, layers)
        resume = waiting.resume or Resume(
            arrival=self._kv.arrive(),
            generated=(),
            sampler=make_row_sampler(params.sampling),
            processors=row_processors(row, self._think_ids, self._eos_ids),
            replaces=hit.source if hit is not None and hit.continues else None,
        )
        (uid,) = generator.insert(
            [list(tokens[start:])],
            max_tokens=[row.max_tokens - len(resume.generated)],
            caches=[layers] if layers is not None else None,
            all_tokens=[list(tokens[:start])],
            samplers=[resume.sampler],
            logits_processors=[resume.processors],
            stop_sequences=[row_stop_sequences(params, self._eos_ids)],
            **adapter_kwargs(params.adapter),
        )
        self.rows[uid] = Row(prepared=row, cached=cached, replaces=resume.replaces, resume=resume)
        self.rows[uid].generated.extend(resume.generated)
        self._uids[row.request_id] = uid
        self._kv.admit(uid, len(tokens), resume.arrival, idle=params.idle)
        if waiting.resume is not None:
            self._kv.resumed += 1
            log.info("gateway.resume", request_id=row.request_id, tokens=len(tokens), cached=cached)
        return cached

    def preempt(self, generator: BatchGenerator) -> None:
        if victims := self._kv.victims():
            self._requeue(generator, victims)

    def _make_room(self, generator: BatchGenerator, waiting: Waiting) -> bool:
        """Preempt idle rows so that a live row waiting for memory starts now; whether it may."""
        if waiting.prepared.params.idle or not (victims := self._kv.room_for(len(waiting.tokens))):
            return False
        self._requeue(generator, victims)
        return True

    def _requeue(self, generator: BatchGenerator, victims: list[int]) -> None:
        from stages.model_thread.sampling import rewind_row

        # Latest arrival first: each goes in front of the one before, so the earliest leads the queue.
        for row in self._take_out(generator, victims):
            rewind_row(row.resume.sampler, row.resume.processors, len(row.generated))
            # Its own entry (a prefix of where it goes on) now stands for the conversation it continued.
            resume = attrs.evolve(row.resume, generated=tuple(row.generated), replaces=None)
            self.waiting.insert(0, Waiting(prepared=row.prepared, resume=resume))
            self._kv.preemptions += 1
        self._order_waiting()
        log.info("gateway.preempt", rows=len(victims), held_bytes=self._kv.held_bytes)

    def _order_waiting(self) -> None:
        # Live rows before idle ones (a stable sort: each keeps its order, preempted rows at their head).
        self.waiting.sort(key=lambda waiting: waiting.prepared.params.idle)

    def remove(self, generator: BatchGenerator, aborts: tuple[Abort, ...]) -> tuple[str, ...]:
        """Drop aborted rows, keeping their KV; the ids of the rows that were in the batch."""
        gone = {abort.request_id for abort in aborts}
        if self.vision is not None:
            for left in (row for row in self.waiting if row.prepared.request_id in gone):
                self.vision.forget(left.prepared.images)
        self.waiting = [row for row in self.waiting if row.prepared.request_id not in gone]
        removed = tuple(request_id for request_id in gone if request_id in self._uids)
        if removed:
            # An aborted row's KV is still a valid prefix: a stop string, or a client that retries.
            self._take_out(generator, [self._uids[request_id] for request_id in removed])
            log.info("gateway.abort", rows=len(removed))
        return removed

    def _take_out(self, generator: BatchGenerator, uids: list[int]) -> list[Row]:
        """Rows leave the batch; what they hold beyond their cached start goes to the prompt cache."""
        caches = generator.remove(uids, return_prompt_caches=self.cache is not None)
        rows = [self.rows.pop(uid) for uid in uids]
        for uid, row in zip(uids, rows):
            del self._uids[row.request_id]
            self._kv.release(uid)
            cache, tokens = caches.get(uid, (None, ()))
            if len(tokens) > row.cached:
                self._keep(row, cache, tokens)
        return rows

    def deltas(self, generated: Sequence[Any]) -> tuple[TokenDelta, ...]:
        """A step's generated responses as token deltas; finished rows leave, their KV to the prompt cache."""
        from stages.model_thread.sampling import token_scores

        deltas = []
        for response in generated:
            finish = _FINISH.get(response.finish_reason) if response.finish_reason else None
            row = self.rows[response.uid]
            row.generated.append(response.token)
            self._kv.advance(response.uid)
            scores = None if row.logprobs is None else (token_scores(response.logprobs, response.token, row.logprobs),)
            deltas.append(row.delta(response.token, finish, scores, getattr(response, "speculated", None)))
            if finish is not None:
                del self.rows[response.uid], self._uids[row.request_id]
                self._kv.release(response.uid)
                self._keep(row, response.prompt_cache, response.all_tokens)
        self._kv.settle()
        return tuple(deltas)

    def checkpoint(self, generator: BatchGenerator, prefilled: Sequence[Any]) -> None:
        # mlx-lm prefills all but a prompt's last token as one segment; at its end the row's cache holds exactly
        # the prompt so far (the turn boundary).
        done = [r.uid for r in prefilled if r.end_of_segment and not r.end_of_prompt and r.uid in self.rows]
        for uid, (cache, tokens) in generator.extract_cache(done).items():
            self._keep(self.rows[uid], cache, tuple(tokens), checkpoint=True)

    def _key(self, row: Prepared, tokens: Sequence[int]) -> tuple[int, ...]:
        """The prompt cache's view of a row's tokens: each image's tokens stand for its picture."""
        if not row.images or self.vision is None:
            return tuple(tokens)
        return keyed(tokens, row.images, self.vision.image_token)

    def _keep(self, row: Row, cache: list[Any] | None, tokens: Sequence[int], *, checkpoint: bool = False) -> None:
        # A checkpoint holds the prompt so far: all of it is prompt, and it replaces nothing.
        import mlx.core as mx

        if self.cache is None or not cache:
            return
        # Evaluated now, the entry's arrays stop referring to the batch's (much larger) ones.
        mx.eval([layer.state for layer in cache])
        prompt_len = len(tokens) if checkpoint else row.prompt_len
        entry = Entry(
            tokens=self._key(row.prepared, tokens),
            cache=cache,
            prompt_len=prompt_len,
            session=row.session,
            adapter=row.adapter,
        )
        self.cache.store(entry, replaces=None if checkpoint else row.replaces)
