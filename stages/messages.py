"""The catalogue of messages that travel between stages (docs/STYLE.md, "Frozen messages").

Each message is frozen; a stage that changes one makes a copy with
`attrs.evolve`. Every message carries the request's `ReplySlot`, so a
stage can skip a request whose client has gone (`reply.closed`) and fail
one with a value (`reply.fail`) without stopping. `TokenDelta` alone is a
msgspec Struct: it crosses from a model worker in every step's frame as
it is (stages/remote/crossing.py), compact and without a copy on either side.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from pipeline.channels import ReplySlot
from pipeline.events import FinishReason
from pipeline.requests import Accepted, AppliedEdit, GenerationParams, GenerationRequest, JsonValue
from pipeline.tracing import Timeline

if TYPE_CHECKING:
    from llguidance import LLMatcher

Reply = ReplySlot[Accepted]
TokenScores = tuple[float, tuple[tuple[int, float], ...]]

# Grammars longer than this compile in the large-grammar slot.
LARGE_GRAMMAR_CHARS = 8 * 1024


@attrs.frozen
class Grammar:
    """A constraint's llguidance grammar text, measured."""

    text: str
    param: str

    @property
    def large(self) -> bool:
        return len(self.text) > LARGE_GRAMMAR_CHARS


@attrs.define
class CompiledConstraint:
    """A validated grammar; `matcher()` gives a fresh matcher for one row."""

    _prototype: LLMatcher = attrs.field(alias="prototype")
    # The request field it came from, which an error mid-generation names.
    param: str = "response_format"
    # What it was compiled from: a model worker compiles it again in its own process (stages/remote/).
    grammar: Grammar | None = None

    def matcher(self) -> LLMatcher:
        return self._prototype.deep_copy()


Decoder = Callable[[JsonValue], GenerationRequest]


class PrepKind(enum.Enum):
    """Kinds of CPU work, each with its own concurrency reservation."""

    TOKENIZE = "tokenize"
    # Compiling a structured-output grammar (llguidance).
    CONSTRAIN = "constrain"
    # Compiling a large one, apart, so it never holds up the small ones.
    CONSTRAIN_LARGE = "constrain_large"


@attrs.frozen
class ReadBody:
    """A request body its route has already read as JSON (a Responses turn: validated before the store lookup).

    Carried as read, so the parse stage does not read the same bytes a second time.
    """

    value: JsonValue


@attrs.frozen(kw_only=True)
class Submission:
    """A request body from the HTTP handler, as bytes or as its route read it, with the API's decoder."""

    request_id: str
    body: bytes | ReadBody
    decode: Decoder
    reply: Reply
    timeline: Timeline


@attrs.frozen(kw_only=True)
class Parsed:
    request_id: str
    request: GenerationRequest
    reply: Reply
    timeline: Timeline


@attrs.frozen
class PromptText:
    """A prompt still to tokenize (a completion's text, a rendered chat)."""

    text: str
    # Completions add the tokenizer's own BOS; a rendered chat template has its own.
    add_special_tokens: bool
    # A chat's render left the model's turn inside a think block (`Prepared.opens_reasoning`).
    opens_reasoning: bool = False


@attrs.frozen(kw_only=True)
class PromptImage:
    """One image of a prompt, decoded and cut into the model's tiles (`stages/prompt/images.py`).

    Its `tokens` image tokens are the next ones of that id in the prompt,
    in order; `digest` (a hash of the decoded pixels) keys the encoder-output
    cache and stands for the image in the prompt cache's keys.
    """

    digest: bytes
    tokens: int
    # (tiles, channels, height, width) uint8, resized and tiled as the model's processor does, not yet normalized.
    pixels: Any = attrs.field(eq=False, repr=False)


@attrs.frozen(kw_only=True)
class Rendered:
    """Prompt tokens of a chat rendered and tokenized in one piece (edited, cut to fit, or with images)."""

    tokens: list[int]
    applied_edits: tuple[AppliedEdit, ...] = ()
    # The prompt's tokens before any edit (Anthropic's `original_input_tokens`).
    original_tokens: int = 0
    # The prompt's images, in the order of their tokens (a vision-language model's).
    images: tuple[PromptImage, ...] = ()
    # The render left the model's turn inside a think block (`Prepared.opens_reasoning`).
    opens_reasoning: bool = False


@attrs.frozen(kw_only=True)
class PrepareJob:
    """CPU work that turns a request into prompt tokens, run off the loop unless it is `inline`.

    `tokenize` is pure and thread-safe; it may raise `RequestError`. It
    gives the prompt's tokens, or its text, which the preparation stage
    tokenizes within bounds (`stages/prompt/tokenize.py`).
    """

    request_id: str
    kind: PrepKind
    tokenize: Callable[[], list[int] | PromptText | Rendered]
    request: GenerationRequest
    params: GenerationParams
    reply: Reply
    timeline: Timeline
    # `tokenize` is a check, or a render of a small conversation: run on the loop, it costs less than a thread's
    # hand-off.
    inline: bool = False


@attrs.frozen(kw_only=True)
class Prepared:
    """A request ready for the gateway: tokens, limits and sampling."""

    request_id: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    params: GenerationParams
    reply: Reply
    timeline: Timeline
    # What the client asked, which the sink reads (tools, parallel calls); None in a model worker, whose model side
    # reads the tokens and parameters alone: the request and its text stay in the front.
    request: GenerationRequest | None = None
    # The row's grammar, when its output is constrained.
    constraint: CompiledConstraint | None = None
    # Its images, in prompt order (a vision-language model's row).
    images: tuple[PromptImage, ...] = ()
    # The render left the model's turn inside a think block (the template's generation prompt opened one, or a
    # continued final message did; `stages/prompt/chat.py`): the reply starts in reasoning. The sink reads it in the
    # front process; it never crosses to a model worker.
    opens_reasoning: bool = False


@attrs.frozen(kw_only=True)
class Abort:
    request_id: str


class TokenDelta(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A row's new tokens in one step; `msgspec.structs.replace` copies one with a change."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish: FinishReason | None = None
    # Per new token: (its logprob, the top (id, logprob) pairs), when asked for.
    logprobs: tuple[TokenScores, ...] | None = None
    # The row's grammar failed making this token (llguidance's reason): the row ends with an error.
    grammar_fault: str | None = None
    # Speculative decoding (stages/model_thread/speculative_batch.py): the row's accepted and proposed tokens, on its
    # last delta.
    speculated: tuple[int, int] | None = None


@attrs.frozen(kw_only=True)
class Admitted:
    """A row the gateway put into the batch during this step."""

    prepared: Prepared
    admitted_at: float
    # Prompt tokens whose KV came from the prompt cache, not from this row's prefill.
    cached_tokens: int = 0


@attrs.frozen(kw_only=True)
class StepOutputs:
    """Everything one decode step produced, for all rows at once.

    Rows admitted in this step come before any of their deltas, so the sink
    always knows a row before it sees its tokens.
    """

    admitted: tuple[Admitted, ...]
    deltas: tuple[TokenDelta, ...]
    stepped_at: float
    # Rows the gateway dropped before this step (their reader left): no delta will follow.
    removed: tuple[str, ...] = ()


def send_abort(aborts: MemoryObjectSendStream[Abort], request_id: str) -> None:
    """Ask the gateway to drop a row before its next step; it is sync
    (docs/STYLE.md, "Cleanup in cancelled tasks").

    The control channel holds one abort per row, so it is never full; once
    the engine has stopped there is no row left to drop.
    """
    try:
        aborts.send_nowait(Abort(request_id=request_id))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
