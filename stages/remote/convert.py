"""Between the pipeline's messages (stages/messages.py) and the crossing's (stages/remote/messages.py).

The front turns a `Prepared` row into a `RowIn` and a worker's `StepOut`
back into the `StepOutputs` the sink reads, with the row's own `Prepared`
(its reply slot, timeline and request stay in the front). The worker
builds its own `Prepared` from a `RowIn`, with a reply slot of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pipeline.errors import ErrorKind, RequestError
from pipeline.events import FinishReason
from pipeline.requests import GenerationParams, Sampling, TextRequest
from pipeline.tracing import Timeline
from stages.messages import Admitted, CompiledConstraint, Prepared, PromptImage, Reply, StepOutputs, TokenDelta
from stages.remote.messages import AdmittedOut, DeltaOut, ErrorOut, FailedOut, ImageIn, RowIn, SamplingIn, StepOut


def error_out(error: RequestError) -> ErrorOut:
    return ErrorOut(
        kind=error.kind.value, message=error.message, param=error.param, code=error.code, retry_after=error.retry_after
    )


def request_error(error: ErrorOut) -> RequestError:
    return RequestError(
        kind=ErrorKind(error.kind),
        message=error.message,
        param=error.param,
        code=error.code,
        retry_after=error.retry_after,
    )


# -- front ------------------------------------------------------------------


def row_in(row: Prepared) -> RowIn:
    params, sampling = row.params, row.params.sampling
    grammar = row.constraint.grammar if row.constraint is not None else None
    return RowIn(
        request_id=row.request_id,
        trace_id=row.reply.trace_id,
        prompt_tokens=list(row.prompt_tokens),
        max_tokens=row.max_tokens,
        sampling=SamplingIn(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            seed=sampling.seed,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            logit_bias=dict(sampling.logit_bias),
            typical_p=sampling.typical_p,
        ),
        cache_key=params.cache_key,
        logprobs=params.logprobs,
        thinking_budget=params.thinking_budget,
        min_tokens=params.min_tokens,
        ignore_eos=params.ignore_eos,
        stop_token_ids=list(params.stop_token_ids),
        adapter=params.adapter,
        grammar=grammar.text if grammar is not None else None,
        grammar_param=grammar.param if grammar is not None else "",
        images=[image_in(image) for image in row.images],
        idle=params.idle,
    )


def image_in(image: PromptImage) -> ImageIn:
    pixels = np.ascontiguousarray(image.pixels, dtype=np.uint8)
    return ImageIn(digest=image.digest, tokens=image.tokens, shape=list(pixels.shape), pixels=pixels.tobytes())


def prompt_image(image: ImageIn) -> PromptImage:
    pixels = np.frombuffer(image.pixels, dtype=np.uint8).reshape(image.shape)
    return PromptImage(digest=image.digest, tokens=image.tokens, pixels=pixels)


def step_outputs(step: StepOut, rows: Mapping[str, Prepared]) -> StepOutputs:
    """The sink's view of a worker's step; rows the front no longer holds (failed meanwhile) are left out."""
    admitted = tuple(
        Admitted(prepared=rows[row.request_id], admitted_at=row.admitted_at, cached_tokens=row.cached_tokens)
        for row in step.admitted
        if row.request_id in rows
    )
    deltas = tuple(
        TokenDelta(
            request_id=delta.request_id,
            new_token_ids=delta.tokens,
            finish=FinishReason(delta.finish) if delta.finish is not None else None,
            logprobs=delta.logprobs,
            grammar_fault=delta.grammar_fault,
            speculated=delta.speculated,
        )
        for delta in step.deltas
    )
    return StepOutputs(admitted=admitted, deltas=deltas, stepped_at=step.stepped_at, removed=tuple(step.removed))


# -- worker -----------------------------------------------------------------


def prepared_of(row: RowIn, reply: Reply, constraint: CompiledConstraint | None) -> Prepared:
    sampling = row.sampling
    params = GenerationParams(
        max_tokens=row.max_tokens,
        sampling=Sampling(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            seed=sampling.seed,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            logit_bias=sampling.logit_bias,
            typical_p=sampling.typical_p,
        ),
        cache_key=row.cache_key,
        logprobs=row.logprobs,
        thinking_budget=row.thinking_budget,
        min_tokens=row.min_tokens,
        ignore_eos=row.ignore_eos,
        stop_token_ids=tuple(row.stop_token_ids),
        adapter=row.adapter,
        idle=row.idle,
    )
    tokens = tuple(row.prompt_tokens)
    # The model side reads only tokens and parameters; the request's text stays in the front.
    return Prepared(
        request_id=row.request_id,
        request=TextRequest(prompt=tokens, params=params),
        prompt_tokens=tokens,
        max_tokens=row.max_tokens,
        params=params,
        reply=reply,
        timeline=Timeline.start(),
        constraint=constraint,
        images=tuple(prompt_image(image) for image in row.images),
    )


def step_out(outputs: StepOutputs, failed: list[FailedOut]) -> StepOut:
    return StepOut(
        admitted=[
            AdmittedOut(request_id=a.prepared.request_id, admitted_at=a.admitted_at, cached_tokens=a.cached_tokens)
            for a in outputs.admitted
        ],
        deltas=[
            DeltaOut(
                request_id=d.request_id,
                tokens=d.new_token_ids,
                finish=d.finish.value if d.finish is not None else None,
                logprobs=d.logprobs,
                grammar_fault=d.grammar_fault,
                speculated=d.speculated,
            )
            for d in outputs.deltas
        ],
        removed=list(outputs.removed),
        stepped_at=outputs.stepped_at,
        failed=failed,
    )
