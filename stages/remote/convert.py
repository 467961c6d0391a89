"""Between the pipeline's messages (stages/messages.py) and the crossing's (stages/remote/crossing.py).

What both sides share crosses as it is: a row's `GenerationParams` and a
step's `TokenDelta`s need no copy here. The front turns a `Prepared` row
into a `RowIn` and a worker's `StepOut` back into the `StepOutputs` the
sink reads, with the row's own `Prepared` (its reply slot, timeline and
request stay in the front). The worker builds its own `Prepared` from a
`RowIn`, with a reply slot of its own and no request.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pipeline.errors import ErrorKind, RequestError
from pipeline.tracing import Timeline
from stages.messages import Admitted, CompiledConstraint, Prepared, PromptImage, Reply, StepOutputs
from stages.remote.crossing import AdmittedOut, ErrorOut, FailedOut, ImageIn, RowIn, StepOut


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
    grammar = row.constraint.grammar if row.constraint is not None else None
    return RowIn(
        request_id=row.request_id,
        trace_id=row.reply.trace_id,
        prompt_tokens=list(row.prompt_tokens),
        max_tokens=row.max_tokens,
        params=row.params,
        grammar=grammar.text if grammar is not None else None,
        grammar_param=grammar.param if grammar is not None else "",
        images=[image_in(image) for image in row.images],
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
    return StepOutputs(admitted=admitted, deltas=step.deltas, stepped_at=step.stepped_at, removed=tuple(step.removed))


# -- worker -----------------------------------------------------------------


def prepared_of(row: RowIn, reply: Reply, constraint: CompiledConstraint | None) -> Prepared:
    tokens = tuple(row.prompt_tokens)
    return Prepared(
        request_id=row.request_id,
        prompt_tokens=tokens,
        max_tokens=row.max_tokens,
        params=row.params,
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
        deltas=outputs.deltas,
        removed=list(outputs.removed),
        stepped_at=outputs.stepped_at,
        failed=failed,
    )
