"""The catalogue of messages that cross between the front and a model worker process.

Typed msgspec Structs, encoded as msgpack (`stages/remote/frames.py` adds
the length prefix). What both sides already share crosses as it is, with
no copy field by field: a row's `GenerationParams` (sampling included),
each step's `TokenDelta`s, and at start the front's decisions (`StartIn`).
A row crosses with its tokens, limits and parameters (the stop strings
and the constraint's spec with them, read by the front alone: 1 µs to
encode, where copying the parameters without them cost 7), its grammar
as text (a compiled llguidance matcher is not picklable; the worker
compiles it again, from its own cache), never its request or reply slot;
and back one frame per decode step for all rows.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from pipeline.requests import GenerationParams
from stages.adapters import Adapter
from stages.cache.prompt import PromptCacheStatistics
from stages.kv.plan import Fit
from stages.messages import TokenDelta
from stages.model_thread.exclusive import ExclusiveStatistics
from stages.model_thread.gateway import GatewayStatistics
from stages.models.loading import ModelInfo


class ErrorOut(msgspec.Struct, frozen=True, array_like=True):
    """A `RequestError` as it crosses (pipeline/errors.py rebuilds it)."""

    kind: str
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None


# -- front → worker ---------------------------------------------------------


class StartIn(msgspec.Struct, frozen=True, array_like=True):
    """What the front decided at its start (stages/engine/decisions.py), so the worker decides none of it again:
    the model (its window as capped, and the weights' form in `float32_weights` / `sixteen_bit_weights`), the memory
    plan (with the machine's figures the front measured), the adapters, and the think markers of the markup family
    (all of the family the model side reads: a family holds parsers, which do not cross). The worker loads the
    tokenizer and weights itself, from `info.path`."""

    info: ModelInfo
    fit: Fit
    adapters: tuple[Adapter, ...] = ()
    think: tuple[str, str] | None = None


class SettingsIn(msgspec.Struct, frozen=True, array_like=True, tag="settings"):
    """The first frame: the engine's settings (`pipeline/settings.py`, as JSON values; no API keys), and its start-up
    decisions. The worker serves what its engine was built with, not what the environment says (several engines,
    several models)."""

    values: dict[str, Any]
    start: StartIn
    # Load nicer until ready (other models' workers serve beside it; workers/priority.py). A spare was started
    # nicer for its imports either way: False sets it back before it loads.
    yield_cpu: bool = False


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
    # As the front holds them.
    params: GenerationParams
    # The row's llguidance grammar and the request field it came from; None: unconstrained.
    grammar: str | None = None
    grammar_param: str = ""
    images: list[ImageIn] = []


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


class FailedOut(msgspec.Struct, frozen=True, array_like=True):
    request_id: str
    error: ErrorOut


class StepOut(msgspec.Struct, frozen=True, array_like=True, tag="step"):
    """One decode step, for every row at once; `monotonic` times are the machine's clock, shared by both processes."""

    admitted: list[AdmittedOut]
    # As the model thread made them; a tuple, as `StepOutputs` holds them, so neither side copies them.
    deltas: tuple[TokenDelta, ...]
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
