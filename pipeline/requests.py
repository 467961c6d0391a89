"""The internal request vocabulary: what a `wire/` decoder produces.

These types are API-neutral. A decoder validates the JSON of its API and
builds one of them; the stages read them and never see the JSON.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
else:
    # A row's `GenerationParams` crosses to a model worker as it is (stages/remote/crossing.py), and msgspec reads
    # these annotations to decode it; it cannot follow a recursive alias, so at run time a JSON value is any value.
    JsonValue = Any
JsonObject = dict[str, JsonValue]


class Role(enum.Enum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@attrs.frozen(kw_only=True)
class ToolCallRecord:
    """A tool call made in an earlier assistant turn; `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


class ImageDetail(enum.Enum):
    """OpenAI's `detail`: `low` reads the image as one tile; `high` and `auto` tile it as the model's processor does."""

    AUTO = "auto"
    LOW = "low"
    HIGH = "high"


@attrs.frozen(kw_only=True)
class ImagePart:
    """An image in a message, as the client sent it: its bytes (a `data:` URL, base64) or an http(s) URL.

    `offset` is where it sits in the message's text (a character index of
    `Message.content`); `param` names the part in the client's request, for
    its 400s. Decoding and checking the picture is the prompt side's work.
    """

    param: str
    offset: int
    data: bytes | None = None
    url: str | None = None
    # The media type the client declared (a data: URL's, Anthropic's `media_type`); None: read from the bytes.
    media_type: str | None = None
    detail: ImageDetail = ImageDetail.AUTO


@attrs.frozen(kw_only=True)
class Message:
    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCallRecord, ...] = ()
    reasoning: str | None = None
    # Images within `content`, in order of their offsets.
    images: tuple[ImagePart, ...] = ()


@attrs.frozen(kw_only=True)
class Tool:
    """A function the model may call; `parameters` is its JSON Schema."""

    name: str
    description: str | None = None
    parameters: JsonObject = attrs.field(factory=dict)
    # A custom tool's grammar (Lark or regex): its one string argument, `input`, must match it.
    input_grammar: Constraint | None = None
    # The client asked for arguments that always match `parameters` (`strict: true`), under `auto` too.
    strict: bool = False


class ToolChoiceMode(enum.Enum):
    AUTO = "auto"
    NONE = "none"
    # The model must call some tool (Anthropic's "any").
    REQUIRED = "required"
    # The model must call `ToolChoice.name`.
    NAMED = "named"


@attrs.frozen(kw_only=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str | None = None


@attrs.frozen(kw_only=True)
class Sampling:
    """Per-row sampler and logits-processor settings.

    `seed` gives the row its own random key, so its output does not depend
    on what else shares the batch. Penalties of None are off. It crosses
    to a model worker as it is (msgspec encodes attrs classes by field
    name): a new field needs no code on the crossing.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: Mapping[int, float] = attrs.field(factory=dict)
    # Locally typical sampling's mass (vLLM / HF `typical_p`); 1.0 is off.
    typical_p: float = 1.0


class ConstraintKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    CHOICE = "choice"
    # A Lark grammar, as llguidance reads it.
    GRAMMAR = "grammar"


@attrs.frozen(kw_only=True)
class Constraint:
    """A structured-output constraint: the output must match `spec`.

    `param` is the request field it came from, for error messages.
    """

    kind: ConstraintKind
    spec: JsonValue
    param: str
    # The whole output, not a format for text beside calls: a forced custom tool's input (Responses).
    whole_output: bool = False


@attrs.frozen(kw_only=True)
class GenerationParams:
    """What every API asks of a generation, whatever its prompt looks like.

    `max_tokens` of None means "up to the end of the context window".
    `cache_key` names the conversation (session affinity): the prompt cache
    keeps its entries warm longer.
    """

    max_tokens: int | None
    sampling: Sampling
    stop: tuple[str, ...] = ()
    cache_key: str | None = None
    constraint: Constraint | None = None
    # Return each token's logprob and this many alternatives; None: no logprobs.
    logprobs: int | None = None
    # Thinking tokens allowed before the think section is closed for the model (Anthropic `budget_tokens`).
    thinking_budget: int | None = None
    # A max_tokens past what the window leaves is cut to fit (the turn then
    # ends at the limit) rather than refused: Anthropic clients always ask
    # for their own model's maximum.
    clamp_max_tokens: bool = False
    # The tokens prompt and reply may take together, below the model's window (Ollama's `num_ctx`): the reply is
    # cut to what the prompt leaves of it (a prompt past it is the API's to refuse, naming its own field).
    context_limit: int | None = None
    # vLLM's extensions: no end-of-sequence or stop token (nor stop string)
    # before `min_tokens`; EOS does not end the row with `ignore_eos`;
    # `stop_token_ids` end it as EOS does, and like EOS are not in the text.
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # Special tokens (the tokenizer's, bar the model's own call and think markup) stay out of the text;
    # vLLM's `skip_special_tokens`, true by default as there.
    skip_special_tokens: bool = True
    # The LoRA adapter the request's `model` named (None: the base model).
    adapter: str | None = None
    # A Batch API line, run at idle priority: no decoder sets it, only the route a batch line runs through
    # (edge/batch_calls.py); the KV scheduler preempts such rows first (stages/kv/scheduler.py).
    idle: bool = False


@attrs.frozen(kw_only=True)
class ClearThinking:
    """Drop the reasoning of earlier assistant turns before rendering.

    `keep_turns` is how many of the most recent assistant turns keep theirs;
    None keeps every turn's (Anthropic's `keep: "all"`).
    """

    keep_turns: int | None = 1


@attrs.frozen(kw_only=True)
class ClearToolUses:
    """Replace the oldest tool results with a placeholder once the prompt is large.

    It triggers when the prompt passes `trigger_tokens`, or holds more than
    `trigger_tool_uses` tool uses (whichever is set); the `keep` most recent
    uses stay, and so do uses of `exclude_tools`. Nothing is cleared unless
    at least `clear_at_least` prompt tokens go. `clear_inputs` also empties
    the calls' arguments: all of them (True) or those of the named tools.
    """

    trigger_tokens: int | None = 100_000
    trigger_tool_uses: int | None = None
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False


ContextEdit = ClearThinking | ClearToolUses


@attrs.frozen(kw_only=True)
class AppliedEdit:
    """What one context edit removed: `cleared` turns or tool uses, and the prompt tokens they held."""

    edit: ContextEdit
    cleared: int
    cleared_input_tokens: int


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A conversation to continue.

    `continue_final` renders the last (assistant) message as the start of
    the answer, not as a finished turn: Anthropic's prefill.
    """

    messages: tuple[Message, ...]
    params: GenerationParams
    template_kwargs: Mapping[str, JsonValue] = attrs.field(factory=dict)
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    # False: the turn ends at its first tool call.
    parallel_tool_calls: bool = True
    continue_final: bool = False
    stream: bool = False
    include_usage: bool = False
    # History edits applied before rendering, in order (Anthropic's context management).
    context_edits: tuple[ContextEdit, ...] = ()
    # The model name the client asked for, echoed where the API echoes it.
    model: str | None = None
    # The model still reasons, but the reply shows none of it (Anthropic's `display: "omitted"`).
    omit_reasoning: bool = False
    # Responses' `truncation: "auto"`: a conversation past the window loses its oldest exchanges until it fits.
    truncate_to_fit: bool = False
    # The body's top-level fields the decoder left unread (wire/field_policy.py), for the route to name.
    unread_fields: tuple[str, ...] = ()

    @property
    def forced_tool(self) -> str | None:
        """The tool every call of the reply must name, where the choice leaves one: the named tool, or the one
        tool offered under `required`; None where the model picks (`auto`, `none`, `required` among several)."""
        if self.tool_choice.mode is ToolChoiceMode.NAMED:
            return self.tool_choice.name
        if self.tool_choice.mode is ToolChoiceMode.REQUIRED and len(self.tools) == 1:
            return self.tools[0].name
        return None


@attrs.frozen(kw_only=True)
class TextRequest:
    """A raw-prompt completion; `prompt` is text or token ids.

    With `suffix` the model fills in the middle between `prompt` and it.
    """

    prompt: str | tuple[int, ...]
    params: GenerationParams
    suffix: str | None = None
    stream: bool = False
    include_usage: bool = False
    # The model name the client asked for, echoed where it is an alias.
    model: str | None = None
    # The body's top-level fields the decoder left unread (wire/field_policy.py), for the route to name.
    unread_fields: tuple[str, ...] = ()


GenerationRequest = ChatRequest | TextRequest


def with_cache_key(request: GenerationRequest, key: str | None) -> GenerationRequest:
    """`request` with `key` as its cache key, unless it has one (the body's field wins over a header)."""
    if key is None or request.params.cache_key is not None:
        return request
    return attrs.evolve(request, params=attrs.evolve(request.params, cache_key=key))


def with_adapter(request: GenerationRequest, adapter: str | None) -> GenerationRequest:
    """`request` run with the LoRA adapter `adapter` (None: the base model)."""
    if adapter == request.params.adapter:
        return request
    return attrs.evolve(request, params=attrs.evolve(request.params, adapter=adapter))


def at_idle_priority(request: GenerationRequest) -> GenerationRequest:
    """`request` as a Batch API line: it yields its place in the batch to live requests."""
    return attrs.evolve(request, params=attrs.evolve(request.params, idle=True))


@attrs.frozen(kw_only=True)
class Accepted:
    """A request that passed preparation: it will be generated.

    `prompt_tokens` is known before the first token, for the APIs that
    report usage at the start of a stream (Anthropic's `message_start`).
    """

    request: GenerationRequest
    prompt_tokens: int
    # The context edits that changed the prompt, in the order they ran.
    applied_edits: tuple[AppliedEdit, ...] = ()
