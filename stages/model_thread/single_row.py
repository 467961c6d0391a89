"""A row alone decodes as mlx-lm's `generate_step` does, and joins the batch when a second row comes.

mlx-lm's `BatchGenerator` pays for batching at every step even when it
holds one row: a `BatchKVCache` with per-row offsets (array ops for RoPE
and the cache index), a causal mask built from the left padding in every
layer, and per-row bookkeeping. `generate_step` decodes one sequence over
plain `KVCache` layers with none of that. On a small model, where the
Python that builds a step's graph is much of the step, the difference is
about a tenth of the step.

`SingleRow` has the face of `BatchGenerator` that the gateway uses
(insert, remove, extract_cache, next, prompt_cache_nbytes, model, close),
with uids of its own. When `next` finds exactly one row inserted and the
batch empty, that row runs here: one prefill chunk per call (so aborts and
new rows are seen between chunks, as in the batch), then a decode step per
call, double-buffered like `generate_step` (the next token's graph is
built and evaluated asynchronously before the current one is read).

The row moves into the batch as soon as another row is inserted. Its KV
and the tokens it holds go with it as the row's cache, which is how the
batch takes any cached prefix, so nothing is computed twice:
- still prefilling: the batch goes on with the rest of the prompt;
- decoding: the token already sampled (its sampler and processors called
  once for it, as the batch's look-ahead does) is read and returned in
  this step, then inserted as the row's one-token prompt. The batch feeds
  it as a prompt's last token and samples the next from it, so each
  token is sampled exactly once and the row's sampler, processors and
  stop automaton see the same sequence as if the row had been in the batch
  all along. A row that ends on that token does not move.
A row that started in the batch stays there. The same arithmetic runs on
either side (the same model, the same per-row sampler and processors, the
processors' context the whole sequence so far), so the tokens are those
the batch gives; tests compare them, greedy and seeded, with processors
and a second row arriving mid-generation.

With speculative decoding on, the row alone speculates here too
(stages/model_thread/lone_speculation.py): a step that proposes verifies the
proposal over the row's own cache, one that does not is the plain step.

Only for models whose cache layers are all plain `KVCache` (the gateway's
checkpoints for other kinds need the batch's segment ends), and never
under a sharded generator, which every rank must replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from stages.model_thread.greedy_steps import sample_rows
from stages.model_thread.lone_speculation import LoneSpeculation
from stages.models.mlx_internals import kv_layer, plain_kv

if TYPE_CHECKING:
    from stages.model_thread.speculative_batch import Speculation

# As the batch does: the allocator's freed buffers go back now and then.
_CLEAR_EVERY = 512


@attrs.define
class _Solo:
    """The row running alone: its cache, what it holds, and what comes next."""

    uid: int
    cache: list[Any]
    # Every token whose KV the cache holds (a cached prefix included).
    fed: list[int]
    # Prompt tokens not fed yet; empty once decoding.
    remaining: list[int]
    # The prompt's length as inserted (a cached prefix not counted), for the batch's progress figure.
    prompt_len: int
    sampler: Any
    processors: list[Any]
    matcher: Any
    stops: Any
    max_tokens: int
    context: Any = None
    generated: int = 0
    # The sampled token and its logprobs, evaluated asynchronously, not yet returned.
    pending: tuple[Any, Any] | None = None


@attrs.define
class SingleRow:
    """`BatchGenerator`'s face over a batch, running a row alone as `generate_step` does; see the module's text."""

    _batch: Any = attrs.field(alias="batch")
    _model: Any = attrs.field(alias="model")
    _default_stops: Any = attrs.field(alias="default_stops")
    # Prompt tokens a prefilling row takes per step; the gateway sizes it before each step
    # (stages/model_thread/step_budget.py).
    _prefill_step_size: int = attrs.field(alias="prefill_step_size")
    # The batch's stream: a row's arrays stay on the thread's own stream whichever side runs it.
    _stream: Any = attrs.field(alias="stream")
    # The row alone's proposals and their verification; None: no speculative decoding.
    _speculation: LoneSpeculation | None = attrs.field(default=None, alias="speculation")
    # Inserted, not yet placed (alone or in the batch): uid -> insert's per-row arguments.
    _waiting: dict[int, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _solo: _Solo | None = attrs.field(default=None, init=False)
    # Our uid -> the batch's, and back.
    _inner: dict[int, int] = attrs.field(factory=dict, init=False)
    _outer: dict[int, int] = attrs.field(factory=dict, init=False)
    _next_uid: int = attrs.field(default=0, init=False)
    _steps: int = attrs.field(default=0, init=False)
    # Rows that ran alone, and rows that moved from here into the batch.
    solo_rows: int = attrs.field(default=0, init=False)
    handovers: int = attrs.field(default=0, init=False)

    @property
    def model(self) -> Any:
        return self._model

    @property
    def stream(self) -> Any:
        return self._stream

    @property
    def prefill_step_size(self) -> int:
        return self._prefill_step_size

    @prefill_step_size.setter
    def prefill_step_size(self, size: int) -> None:
        self._prefill_step_size = self._batch.prefill_step_size = size

    @property
    def prompt_cache_nbytes(self) -> int:
        solo = sum(layer.nbytes for layer in self._solo.cache) if self._solo is not None else 0
        return int(self._batch.prompt_cache_nbytes) + solo

    def insert(self, prompts: list[list[int]], **per_row: Any) -> list[int]:
        uids = []
        for index, prompt in enumerate(prompts):
            # The batch's own checks, here where they fail the one row rather than a later step.
            if not prompt or (per_row.get("max_tokens") or [1])[index] <= 0:
                raise ValueError("a row needs a prompt and max_tokens > 0")
            uid, self._next_uid = self._next_uid, self._next_uid + 1
            self._waiting[uid] = {
                "prompt": list(prompt),
                **{key: (value[index] if value is not None else None) for key, value in per_row.items()},
            }
            uids.append(uid)
        return uids

    def remove(self, uids: Sequence[int], return_prompt_caches: bool = False) -> dict[int, Any]:
        caches: dict[int, Any] = {}
        solo = self._solo
        if solo is not None and solo.uid in uids:
            self._solo = None
            if self._speculation is not None:
                self._speculation.finished(solo.uid)
            if return_prompt_caches:
                caches[solo.uid] = (_copied(solo.cache), list(solo.fed))
        for uid in uids:
            self._waiting.pop(uid, None)
        inner = [self._inner[uid] for uid in uids if uid in self._inner]
        if inner:
            found = self._batch.remove(inner, return_prompt_caches=return_prompt_caches)
            caches.update((self._outer[local], value) for local, value in found.items())
            for local in inner:
                del self._inner[self._outer.pop(local)]
        return caches

    def extract_cache(self, uids: Sequence[int]) -> dict[int, Any]:
        caches: dict[int, Any] = {}
        if self._solo is not None and self._solo.uid in uids:
            caches[self._solo.uid] = (_copied(self._solo.cache), list(self._solo.fed))
        inner = [self._inner[uid] for uid in uids if uid in self._inner]
        if inner:
            caches.update((self._outer[local], value) for local, value in self._batch.extract_cache(inner).items())
        return caches

    def next(self) -> tuple[list[Any], list[Any]]:
        import mlx.core as mx

        with mx.stream(self._stream):
            if self._solo is None and len(self._waiting) == 1 and not self._inner:
                self._start(*self._waiting.popitem())
            if self._solo is not None and not self._waiting:
                return self._solo_step()
            # Another row came: the one alone joins the batch first, so it keeps its place in the queue.
            handed = self._hand_over() if self._solo is not None else []
            self._place_waiting()
            if not self._inner:
                return [], handed
            prefilled, generated = self._batch.next()
        return [self._translated(r) for r in prefilled], handed + [self._translated(r) for r in generated]

    def close(self) -> None:
        self._solo = None
        self._batch.close()

    # -- alone ----------------------------------------------------------------

    def _start(self, uid: int, row: dict[str, Any]) -> None:
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.sample_utils import greedy_sampler

        given = row.get("caches")
        cache = _copied(given) if given else make_prompt_cache(self._model)
        fed = list(row.get("all_tokens") or [])
        processors = list(row.get("logits_processors") or [])
        stops = row.get("stop_sequences") or self._default_stops
        self._solo = _Solo(
            uid=uid,
            cache=cache,
            fed=fed,
            remaining=row["prompt"],
            prompt_len=len(row["prompt"]),
            sampler=row.get("samplers") or greedy_sampler,
            processors=processors,
            matcher=stops.matcher(),
            stops=stops,
            max_tokens=row["max_tokens"],
        )
        self.solo_rows += 1

    def _solo_step(self) -> tuple[list[Any], list[Any]]:
        """One call's prefill chunk (reported as the batch reports its own) and decoded token."""
        import mlx.core as mx
        from mlx_lm.generate import PromptProcessingBatch

        solo = self._solo
        assert solo is not None  # next() checked
        prefilled: list[Any] = []
        if len(solo.remaining) > 1:
            # Chunked prefill, one chunk per call, every prompt token but the last.
            chunk = solo.remaining[: min(self._prefill_step_size, len(solo.remaining) - 1)]
            self._model(mx.array(chunk)[None], cache=solo.cache)
            mx.eval([layer.state for layer in solo.cache])
            solo.fed += chunk
            solo.remaining = solo.remaining[len(chunk) :]
            mx.clear_cache()
            progress = (solo.prompt_len - len(solo.remaining), solo.prompt_len)
            prefilled.append(PromptProcessingBatch.Response(solo.uid, progress, len(solo.remaining) == 1, False))
            if len(solo.remaining) > 1:
                return prefilled, []
        if solo.pending is None:
            from mlx_lm.models.cache import TokenBuffer

            # As the batch's context: the whole sequence so far, its last token added by the step.
            buffer: Callable[[list[int]], Any] = TokenBuffer  # untyped in mlx-lm
            solo.context = buffer(solo.fed) if solo.processors else None
            solo.pending = self._forward(solo, mx.array(solo.remaining))
            solo.fed += solo.remaining
            solo.remaining = []
        self._steps += 1
        if self._steps % _CLEAR_EVERY == 0:
            mx.clear_cache()
        verified = self._speculation.step(self._model, solo) if self._speculation is not None else None
        if verified is not None:
            return prefilled, self._emit_verified(solo, verified)
        token, logprobs = solo.pending
        # The next token's graph, built on this one before it is read: the step's overlap. Not after the first token,
        # which goes out at once and is fed next call as a prompt's last token is: on a CPU `async_eval` runs the pass
        # before it returns, and held for it the first token came a decode step late (SmolLM2, two cores: 45 ms).
        solo.pending = self._forward(solo, token) if solo.generated else None
        value = int(token.item())
        (solo.fed if solo.pending is not None else solo.remaining).append(value)
        emitted = self._emit(solo, value, logprobs)
        if self._speculation is not None:
            self._speculation.plain_step()
        return prefilled, emitted

    def _emit_verified(self, solo: _Solo, tokens: list[tuple[int, Any]]) -> list[Any]:
        """The responses for a verified step's tokens, in order, up to the one the row ends on."""
        responses: list[Any] = []
        for value, logprobs in tokens:
            solo.fed.append(value)
            responses += self._emit(solo, value, logprobs)
            if responses[-1].finish_reason is not None:
                break
        return responses

    def _forward(self, solo: _Solo, tokens: Any) -> tuple[Any, Any]:
        import mlx.core as mx

        logits = self._model(tokens[None], cache=solo.cache)[:, -1, :]
        if solo.context is not None:
            context = solo.context.update_and_fetch(tokens)
            for processor in solo.processors:
                logits = processor(context, logits)
        sampled, logprobs = sample_rows(logits, [solo.sampler])
        start: Callable[..., None] = mx.async_eval  # untyped in mlx's stubs
        start(sampled)
        return sampled, logprobs[0]

    def _emit(self, solo: _Solo, token: int, logprobs: Any) -> list[Any]:
        """The row's response for `token`; a finished row leaves with its cache."""
        from stages.model_thread.speculative_batch import SpeculativeResponse

        solo.generated += 1
        # The batch's order: the length first, then the stop automaton (which must see every token).
        finish = "length" if solo.generated >= solo.max_tokens else None
        finish = "stop" if solo.matcher.advance(token) else finish
        cache, tokens, speculated = None, None, None
        if finish is not None:
            self._solo = None
            # What the cache holds: the last token too, unless it was read at a hand-over before being fed; never
            # the accepted proposal's tokens after the one the row ends on.
            excess = solo.cache[0].offset - len(solo.fed) if solo.cache else 0
            for layer in solo.cache if excess > 0 else ():
                layer.trim(excess)
            cache, tokens = _copied(solo.cache), list(solo.fed)
            speculated = self._speculation.finished(solo.uid) if self._speculation is not None else None
        return [SpeculativeResponse(solo.uid, token, logprobs, finish, cache, tokens, speculated)]

    # -- into the batch -------------------------------------------------------

    def _hand_over(self) -> list[Any]:
        """Move the row alone into the batch; the response for the token it had sampled, if any."""
        solo = self._solo
        assert solo is not None  # next() checked
        self._solo = None
        responses: list[Any] = []
        prompt = solo.remaining
        if solo.pending is not None:
            token, logprobs = solo.pending
            prompt = [int(token.item())]
            responses = self._emit(solo, prompt[0], logprobs)
            if responses[0].finish_reason is not None:
                return responses
        (local,) = self._batch.insert(
            [prompt],
            max_tokens=[solo.max_tokens - solo.generated],
            caches=[solo.cache],
            all_tokens=[solo.fed],
            samplers=[solo.sampler],
            logits_processors=[solo.processors],
            stop_sequences=[solo.stops],
        )
        self._inner[solo.uid], self._outer[local] = local, solo.uid
        if self._speculation is not None:
            self._speculation.handed_over(solo.uid, local)
        self.handovers += 1
        return responses

    def _place_waiting(self) -> None:
        for uid, row in self._waiting.items():
            prompt = row.pop("prompt")
            (local,) = self._batch.insert([prompt], **{key: [value] for key, value in row.items() if value is not None})
            self._inner[uid], self._outer[local] = local, uid
        self._waiting.clear()

    def _translated(self, response: Any) -> Any:
        import dataclasses

        uid = self._outer[response.uid]
        if getattr(response, "finish_reason", None) is not None:
            del self._inner[uid], self._outer[response.uid]
        return dataclasses.replace(response, uid=uid)


def _copied(cache: Sequence[Any]) -> list[Any]:
    """Each layer as a `KVCache` of its own arrays, cut to what it holds (as the batch's `extract` gives).

    A slice would be a view that keeps the whole 256-position buffer alive;
    a copy is what the prompt cache counts. And a layer whose arrays are
    exactly its size is never written in place: the next token reallocates.
    """
    import mlx.core as mx

    layers = []
    for layer in cache:
        kv = plain_kv(layer)
        layers.append(kv_layer(mx.contiguous(kv[0]), mx.contiguous(kv[1])) if kv is not None else layer)
    return layers


def single_row(
    make: Callable[[], Any],
    *,
    enabled: bool,
    model: Any,
    stop_tokens: Sequence[Sequence[int]],
    prefill_step_size: int,
    speculation: Speculation | None = None,
) -> Callable[[], Any]:
    """`make` (a `BatchGenerator` factory) with its single rows run alone where `enabled` (the caller
    checks the model's cache layers are all plain), speculating there under `speculation`."""
    from mlx_lm.generate import StopSequences

    if not enabled:
        return make

    def build() -> SingleRow:
        batch = make()
        return SingleRow(
            batch=batch,
            model=model,
            default_stops=StopSequences(stop_tokens or None),
            prefill_step_size=prefill_step_size,
            stream=batch.stream,
            speculation=LoneSpeculation(speculation) if speculation is not None else None,
        )

    return build
