"""A batch step as one forward pass: the decoding rows, the rows taking their first token, and a prompt's chunk.

mlx-lm's `BatchGenerator._next` runs up to three passes in a step that prefills beside decoding rows: the
decoding rows' ([R, 1], or a verifying pass [R, 1 + K] under speculation, speculative_batch.py), the rows whose
prompt just ended ([k, 1], their first token), and the prompts' next chunk ([B, L]). Each pass reads every
weight, and on a CPU a pass of a few rows computes at a third of a large one's rate, so a step that prefills
beside decoding rows pays about twice for what one pass does (docs/benchmarks.md, "One pass a step"). Here such
a step keeps mlx-lm's bookkeeping, line for line, and runs its passes as one (stages/models/mixed_pass.py): the
generation batch's call to its model builds the mixed pass, and the other two batches' calls are answered from
it.

A step falls back to mlx-lm's own where there is nothing to mix (no row decoding, or no prompt work), and where
the batch is full (mlx-lm then prefills nothing). Prompts whose chunks differ in length are right-padded and
their caches told so around the pass, as mlx-lm's `PromptProcessingBatch.prompt` does.

Like speculative_batch.py this reads mlx-lm's private fields. Model thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from stages.models.mixed_pass import ALL, LAST, NONE, Segment, mixable, mixed_forward
from stages.models.mlx_internals import PLAIN, ROTATING


@attrs.define
class _Answer:
    """A batch's model for one call, answered from the mixed pass: that batch's own segment."""

    cache: Any
    logits: Any
    used: bool = False

    def __call__(self, inputs: Any, cache: Any = None, **_: Any) -> Any:
        # Anything else would run against caches the mixed pass already advanced.
        if cache is not self.cache or self.used:
            raise RuntimeError("a mixed step's batch called its model for a pass it did not plan")
        self.used = True
        return self.logits


@attrs.define
class _Mixing:
    """The generation batch's model for one step: its call builds the pass with the other segments in it."""

    model: Any
    others: list[Segment]
    results: list[Any] = attrs.field(factory=list)

    def __call__(self, inputs: Any, cache: Any = None, **_: Any) -> Any:
        if self.results:
            raise RuntimeError("a mixed step's generation batch called its model twice")
        self.results = mixed_forward(self.model, [Segment(inputs, cache, ALL), *self.others])
        return self.results[0]

    def result(self, index: int) -> Any:
        """The `index`-th other segment's logits; run alone if the generation batch never called its model."""
        if not self.results:
            self.results = [None, *mixed_forward(self.model, self.others)]
        return self.results[index + 1]


@attrs.define
class MixedCounts:
    """The steps run as one pass, for /stats: every generator's (one per adapter) together."""

    steps: int = 0


@attrs.define
class MixedSteps:
    """Replaces a generator's `_next`: a step that prefills beside decoding rows runs as one pass."""

    generator: Any
    model: Any
    plain: Callable[[], Any]
    counts: MixedCounts = attrs.field(factory=MixedCounts)

    def __call__(self) -> Any:
        import mlx.core as mx
        from mlx_lm.generate import PromptProcessingBatch

        g = self.generator
        generation = g._generation_batch
        if not len(generation) or len(generation) >= g.completion_batch_size:
            return self.plain()
        # Admission as mlx-lm's step makes it (before the decode, not after: a row finishing this step leaves
        # its place one step later).
        n = min(
            g.prefill_batch_size - len(g._prompt_batch),
            g.completion_batch_size - len(generation),
            len(g._unprocessed_sequences),
        )
        if n > 0:
            g._prompt_batch.extend(g._make_batch(n))
        processing = g._currently_processing
        if not processing:
            return self.plain()
        split = [i for i, seq in enumerate(processing) if len(seq[0]) == 1 and len(seq[0][0]) == 1]
        kept = [i for i in range(len(processing)) if i not in split]
        self.counts.steps += 1
        prompt_responses: list[Any] = []
        others: list[Segment] = []
        newcomers = last_inputs = None
        if split:
            last_inputs = [processing[i][0][0] for i in split]
            progress = [(processing[i][2],) * 2 for i in split]
            g._currently_processing = [processing[i] for i in kept]
            newcomers = g._prompt_batch.split(split)
            others.append(Segment(mx.array([[t[-1]] for t in last_inputs]), newcomers.prompt_cache, LAST))
        chunk = []
        chunk_responses = []
        for i, seq in enumerate(g._currently_processing):
            response = PromptProcessingBatch.Response(g._prompt_batch.uids[i], (0, 0), False, False)
            segments = seq[0]
            take = min(len(segments[0]), g.prefill_step_size)
            chunk.append(segments[0][:take])
            segments[0] = segments[0][take:]
            if len(segments[0]) == 0:
                segments.pop(0)
                response.end_of_segment = True
            seq[1] += take
            response.progress = (seq[1], seq[2])
            chunk_responses.append(response)
        padded = _Chunk.of(g._prompt_batch, chunk) if chunk else None
        if padded is not None:
            others.append(Segment(padded.tokens, g._prompt_batch.prompt_cache, NONE))

        mixing = _Mixing(self.model, others)
        tic = time.perf_counter()
        generation.model = mixing
        try:
            generation_responses = generation.next()
        finally:
            generation.model = self.model
        counters = g._counters
        counters.decode_time += time.perf_counter() - tic
        counters.generation_tokens += len(generation_responses)
        counters.generation_steps += 1
        if counters.generation_steps % 512 == 0:
            mx.clear_cache()

        if newcomers is not None:
            assert last_inputs is not None
            newcomers.model = _Answer(newcomers.prompt_cache, mixing.result(0))
            started = newcomers.generate(last_inputs)
            started.model = self.model
            prompt_responses.extend(
                PromptProcessingBatch.Response(uid, p, True, True) for uid, p in zip(started.uids, progress)
            )
            g._generation_batch.extend(started)
        prompt_responses.extend(chunk_responses)
        if padded is not None:
            counters.prompt_tokens += sum(len(p) for p in chunk)
            tic = time.perf_counter()
            mixing.result(len(others) - 1)
            padded.finish(g._prompt_batch)
            counters.prompt_time += time.perf_counter() - tic
        return prompt_responses, generation_responses


@attrs.frozen
class _Chunk:
    """The prompts' chunk as mlx-lm's `PromptProcessingBatch.prompt` lays it out for its one pass: right-padded
    to the longest (its `_right_pad_prompts`), the caches told the padding before the pass and rolling it to the
    left after."""

    tokens: Any
    padding: bool

    @classmethod
    def of(cls, batch: Any, chunk: list[list[int]]) -> _Chunk:
        import mlx.core as mx
        from mlx_lm.generate import _right_pad_prompts

        # The batch's tokens are the ones its cache holds once the pass has run.
        for held, taken in zip(batch.tokens, chunk):
            held += taken
        lengths = [len(p) for p in chunk]
        padding = [max(lengths) - length for length in lengths]
        if not any(padding):
            return cls(mx.array(chunk), False)
        for layer in batch.prompt_cache:
            layer.prepare(lengths=lengths, right_padding=padding)
        return cls(_right_pad_prompts(chunk, max_length=max(lengths)), True)  # type: ignore[no-untyped-call]

    def finish(self, batch: Any) -> None:
        import mlx.core as mx

        mx.eval([layer.state for layer in batch.prompt_cache])
        if self.padding:
            for layer in batch.prompt_cache:
                layer.finalize()
            mx.eval([layer.state for layer in batch.prompt_cache])
        mx.clear_cache()


def mixing(
    make: Callable[[], Any], model: Any, cache_kind: str, counts: MixedCounts | None = None
) -> Callable[[], Any]:
    """`make` (a BatchGenerator factory) whose generators run a step that prefills beside decoding as one pass;
    `make` itself where `model` cannot mix, or its layers keep a state that is not per token (`cache_kind`)."""
    if cache_kind not in (PLAIN, ROTATING) or not mixable(model):
        return make

    def build() -> Any:
        generator = make()
        generator._next = MixedSteps(generator, model, generator._next, counts or MixedCounts())
        return generator

    return build
