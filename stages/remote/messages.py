"""The catalogue of messages that cross between the front and a model worker process.

Typed msgspec Structs, encoded as msgpack (`stages/remote/frames.py` adds
the length prefix). Only what the model side needs crosses: a row's tokens,
limits and sampling (never its stop strings, text or reply slot), its
grammar as text (a compiled llguidance matcher is not picklable; the
worker compiles it again, from its own cache), and back one frame per
decode step for all rows.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from stages.cache.prompt import PromptCacheStatistics
from stages.model_thread.exclusive import ExclusiveStatistics
from stages.model_thread.gateway import GatewayStatistics

# (its logprob, the top (id, logprob) pairs) of one token.
Scores = tuple[float, tuple[tuple[int, float], ...]]


class SamplingIn(msgspec.Struct, frozen=True, array_like=True):
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    repetition_penalty: float | None
    logit_bias: dict[int, float]
    typical_p: float


class ErrorOut(msgspec.Struct, frozen=True, array_like=True):
    """A `RequestError` as it crosses (pipeline/errors.py rebuilds it)."""

    kind: str
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None


# -- front → worker ---------------------------------------------------------


class SettingsIn(msgspec.Struct, frozen=True, array_like=True, tag="settings"):
    """The first frame: the engine's settings (`pipeline/settings.py`, as JSON values; no API keys). The
    worker serves what its engine was built with, not what the environment says (several engines, several
    models)."""

    values: dict[str, Any]
    # Load nicer until ready (other models' workers serve beside it; workers/priority.py). A spare was started
    # nicer for its imports either way: False sets it back before it loads.
    yield_cpu: bool = False
    # The memory copy figure the front measured for its own plan (stages/kv/machine.py): the worker plans with it
    # rather than probing again (0.11 s of CPU and 128 MiB touched at every start and restart).
    measured_bandwidth: float | None = None


class ImageIn(msgspec.Struct, frozen=True, array_like=True):
    """One image of a row: its tiles as uint8 bytes of `shape` (decoded and tiled in the front, so the worker's
    model thread only normalizes them and runs the tower), its digest and its token count."""

    digest: bytes
    tokens: int
    shape: list[int]
    pixels: bytes


class RowIn(msgspec.Struct, frozen=True, array_like=True, tag="row"):
    request_id: str
    trace_id: str
    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingIn
    cache_key: str | None
    logprobs: int | None
    thinking_budget: int | None
    min_tokens: int
    ignore_eos: bool
    stop_token_ids: list[int]
    adapter: str | None
    # The row's llguidance grammar and the request field it came from; None: unconstrained.
    grammar: str | None = None
    grammar_param: str = ""
    images: list[ImageIn] = []
    # A Batch API line's row, preempted first (stages/kv/scheduler.py).
    idle: bool = False


class AbortIn(msgspec.Struct, frozen=True, array_like=True, tag="abort"):
    request_id: str


class JobIn(msgspec.Struct, frozen=True, array_like=True, tag="job"):
    """Exclusive work: embeddings ("embed") or yes/no scores ("score") over token inputs."""

    job_id: int
    kind: Literal["embed", "score"]
    inputs: list[list[int]]
    request_id: str
    trace_id: str
    rate_key: str
    # The dedicated embedding model's, not the chat model's.
    side: bool = False
    pooling: Literal["mean", "last"] = "mean"
    dimensions: int | None = None
    yes: int = 0
    no: int = 0


class CancelIn(msgspec.Struct, frozen=True, array_like=True, tag="cancel"):
    job_id: int


class CloseIn(msgspec.Struct, frozen=True, array_like=True, tag="close"):
    """No more rows will come: finish the rows held, then end."""


class StatsIn(msgspec.Struct, frozen=True, array_like=True, tag="stats"):
    """Send a heartbeat now: `/stats` reads the model side's figures as of this moment."""


ToWorker = SettingsIn | RowIn | AbortIn | JobIn | CancelIn | CloseIn | StatsIn


# -- worker → front ---------------------------------------------------------


class AdmittedOut(msgspec.Struct, frozen=True, array_like=True):
    request_id: str
    admitted_at: float
    cached_tokens: int


class DeltaOut(msgspec.Struct, frozen=True, array_like=True):
    # Tuples, as `TokenDelta` holds them: both sides use what msgspec hands over without copying it again.
    request_id: str
    tokens: tuple[int, ...]
    # pipeline.events.FinishReason's value.
    finish: str | None = None
    logprobs: tuple[Scores, ...] | None = None
    # Why the row's grammar matcher failed mid-generation: the front's sink fails the row with it.
    grammar_fault: str | None = None
    # Speculative decoding: the row's accepted and proposed tokens, on its last delta.
    speculated: tuple[int, int] | None = None


class FailedOut(msgspec.Struct, frozen=True, array_like=True):
    request_id: str
    error: ErrorOut


class StepOut(msgspec.Struct, frozen=True, array_like=True, tag="step"):
    """One decode step, for every row at once; `monotonic` times are the machine's clock, shared by both processes."""

    admitted: list[AdmittedOut]
    deltas: list[DeltaOut]
    removed: list[str]
    stepped_at: float
    failed: list[FailedOut] = []


class JobOut(msgspec.Struct, frozen=True, array_like=True, tag="job_done"):
    job_id: int
    # Embeddings as float32 bytes, one per input; scores one per pair; or the job's error.
    vectors: list[bytes] | None = None
    scores: list[float] | None = None
    error: ErrorOut | None = None


class ReadyOut(msgspec.Struct, frozen=True, array_like=True, tag="ready"):
    pid: int


class BeatOut(msgspec.Struct, frozen=True, array_like=True, tag="beat"):
    """The worker is alive; with its model side's figures for `/stats`."""

    gateway: GatewayStatistics | None = None
    prompt_cache: PromptCacheStatistics | None = None
    exclusive: ExclusiveStatistics | None = None


class RefusedOut(msgspec.Struct, frozen=True, array_like=True, tag="refused"):
    """The worker cannot serve its model with these settings (an unsupported KV scheme, a model that does not
    load): the front's first answer instead of `ReadyOut`, so the reason reaches its log, /health and /v1/models."""

    reason: str


ToFront = StepOut | JobOut | ReadyOut | BeatOut | RefusedOut
