"""Settings, read once from `MLX_RELAY_*` environment variables.

`hypercorn app:app` takes no application arguments, so the environment is
the configuration. A bad value fails start-up with a message that names
the variable, and so does a `MLX_RELAY_*` variable that names no setting
(a misspelt one would otherwise be silently ignored).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from pipeline.env_values import PREFIX, SettingsError, boolean, convert, parser, refuse_unknown
from pipeline.logs import LOG_FORMATS, RENDERING_VARIABLE

# Variables of this prefix that other modules read, outside the settings.
# MLX_RELAY_CPU_ATTENTION: read where the model loads (stages/models/cpu_attention.py), in every model worker.
OTHER_VARIABLES = frozenset(
    {"MLX_RELAY_DEMO_CACHE", "MLX_RELAY_SHARD_COORDINATOR", "MLX_RELAY_CPU_ATTENTION", RENDERING_VARIABLE}
)


_positive = attrs.validators.gt(0)


def _lower(value: str) -> str:
    return value.lower()


_non_negative = attrs.validators.ge(0.0)


# The names MLX_RELAY_TOOL_PARSER and MLX_RELAY_REASONING_PARSER take: stages/families/'s `TOOL_PARSERS` and
# `THINK_MARKERS`, spelt out since pipeline/ imports nothing of ours (a test holds the two equal).
TOOL_PARSER_NAMES = (
    *("harmony", "deepseek", "deepseek_dsml", "mistral", "phi4", "hermes", "llama3", "llama4", "json"),
    *("qwen3_coder", "glm", "minimax", "kimi", "kimi_k3", "gemma4", "mlx-lm"),
)
REASONING_PARSER_NAMES = ("none", "think", "mistral", "harmony", "kimi_k3", "gemma4")


def _lookup_mode(value: bool | str | None) -> bool | None:
    """`MLX_RELAY_PROMPT_LOOKUP`: unset or `auto` None (on where it can run), else a boolean."""
    if value is None or isinstance(value, bool):
        return value
    if value.strip().lower() == "auto":
        return None
    try:
        return boolean(value)
    except ValueError:
        raise ValueError(
            f"MLX_RELAY_PROMPT_LOOKUP={value!r} is not one of auto, 1, 0 (or true, false, on, off)"
        ) from None


@attrs.frozen(kw_only=True)
class Settings:
    """Every knob of the server; the defaults suit the built-in models on a laptop."""

    # A built-in model (smollm2, demo, tiny), a local directory or a Hugging
    # Face repo id; None serves `demo_model`.
    model: str | None = None
    # The built-in model served when `model` is unset: SmolLM2 answers;
    # the random-weight `demo` and `tiny` are for shape and speed tests.
    demo_model: str = "smollm2"
    model_name: str | None = None
    # Other names for the served model, "alias=served_id,…": listed by
    # /v1/models and echoed back to a client that asks by one.
    model_aliases: str | None = attrs.field(default=None, validator=lambda _i, _a, value: _check_aliases(value))
    # LoRA adapters in mlx-lm's format served as model ids of their own: "name=path,name2=path2" (stages/adapters.py).
    adapters: str | None = None
    # Several models served by name: a TOML models file (fleet/spec.py); MLX_RELAY_MODEL may also list
    # several, comma-separated.
    models_file: str | None = None
    # One model's defaults, which a request's own value overrides (a models file sets them per model):
    # sampling (unset: the model's generation_config.json), max_tokens, the adapter a request naming the base
    # model gets, and a context window below the model's own.
    default_temperature: float | None = attrs.field(default=None, converter=attrs.converters.optional(float))
    default_top_p: float | None = attrs.field(default=None, converter=attrs.converters.optional(float))
    default_top_k: int | None = attrs.field(default=None, converter=attrs.converters.optional(int))
    default_max_tokens: int | None = attrs.field(default=None, converter=attrs.converters.optional(int))
    default_adapter: str | None = None
    context_limit: int | None = attrs.field(default=None, converter=attrs.converters.optional(int))
    # A model family's call markup / think markers, where the template and vocabulary mislead (stages/families/).
    tool_parser: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(TOOL_PARSER_NAMES))
    )
    reasoning_parser: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(REASONING_PARSER_NAMES))
    )
    max_batch: int = attrs.field(default=16, validator=_positive)
    max_pending: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    admission_timeout: float = attrs.field(default=2.0, validator=_non_negative)
    retry_after: float = attrs.field(default=1.0, validator=_non_negative)
    drain_timeout: float = attrs.field(default=30.0, validator=_non_negative)
    prefill_step_size: int = attrs.field(default=512, validator=_positive)
    # The time one step of the model thread aims at: a prefill chunk is sized from the measured prefill speed
    # to fit it beside the decoding rows, and exclusive work on an idle server runs in turns of this length.
    step_budget_ms: float = attrs.field(default=200.0, validator=attrs.validators.gt(0.0))
    # Beside decoding rows, a step aims at this multiple of their decode-only step, never below step_budget_ms;
    # 0 makes step_budget_ms a fixed target, and so does setting MLX_RELAY_STEP_BUDGET_MS without this.
    step_budget_ratio: float = attrs.field(default=2.0, validator=_non_negative)
    # A row alone decodes as mlx-lm's generate_step does, without the batch's per-step costs, and joins
    # the batch when a second row comes (stages/model_thread/single_row.py); off runs every row in the batch.
    single_row: bool = True
    # A step that prefills beside decoding rows runs as one forward pass over both, where the model's shape allows
    # (stages/model_thread/mixed_steps.py); off runs mlx-lm's separate passes.
    mixed_steps: bool = True
    prepare_concurrency: int = attrs.field(default=2, validator=_positive)
    # Structured-output grammars compiling at once (each can take a core).
    constraint_concurrency: int = attrs.field(default=1, validator=_positive)
    # KV bytes the prompt cache keeps in memory (at most half of what the
    # weights and a prefill chunk leave of the budget); 0 turns it off.
    prompt_cache_bytes: int = attrs.field(default=2**30, validator=attrs.validators.ge(0))
    # Entries it keeps at most, whatever their bytes (0: no bound beside the bytes).
    prompt_cache_entries: int = attrs.field(default=4096, validator=attrs.validators.ge(0))
    # Requests that name a session keep their conversation's entries warm longer.
    session_cache: bool = True
    # The older spelling of `weights="stored"` (kept: documented and in use).
    keep_quantized: bool = False
    # The form a quantized model's weights are served in (stages/engine/weight_forms.py): `auto` picks by the
    # window each form's memory plan admits and the forms' measured speed; the others name one.
    weights: str = attrs.field(
        default="auto", converter=_lower, validator=lambda settings, _, value: _weights_form(settings, value)
    )
    # A folder for the prompt cache's disk tier (unset: no disk tier), and its bound.
    cache_dir: str | None = None
    cache_dir_bytes: int = attrs.field(default=8 * 2**30, validator=_positive)
    # A quantized KV cache (stages/models/quantized_kv.py): 4 or 8 bits per value, a scale and bias per group
    # of `kv_group_size`; unset keeps it full precision. Every row is quantized from `quantized_kv_start`.
    kv_bits: int | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(int),
        validator=attrs.validators.optional(attrs.validators.in_((4, 8))),
    )
    kv_group_size: int = attrs.field(default=64, validator=attrs.validators.in_((32, 64, 128)))
    quantized_kv_start: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    # Speculative decoding inside the batch (stages/engine/speculation.py, docs/speculative-decoding.md): proposals from
    # the row's own prompt and output (`prompt_lookup`) or from a smaller model with the same vocabulary. Prompt
    # lookup is on by default (None, `auto`): the measured gate speculates only where it is faster, and a set-up it
    # cannot run in (sharded, adapters, rotating cache layers, a draft model) keeps it off quietly; True (`1`,
    # `--prompt-lookup`) asks for it, and a set-up it cannot run in is refused at start; False (`0`) turns it off.
    prompt_lookup: bool | None = attrs.field(default=None, converter=_lookup_mode)
    draft_model: str | None = attrs.field(
        default=None, validator=lambda settings, _, value: _one_drafter(settings, value)
    )
    # Tokens a row proposes at most per step (mlx-lm's --num-draft-tokens); each row's own k adapts below it. 8, not
    # 4: a forward pass over 9 positions costs little more than over 1 where it is memory-bound (Metal, CUDA, a CPU
    # with a real BLAS); SmolLM2 repeating a paragraph to its end of turn: 2.82x at 8, 2.26x at 4; demo copying code
    # the same at either (docs/speculative-decoding.md).
    num_draft_tokens: int = attrs.field(default=8, validator=attrs.validators.in_(range(1, 17)))
    # Rows in the batch above which no row speculates: verifying then costs more than it saves. Unset: 4 on Metal and
    # CUDA (measured on demo), 1 on the CPU backend, where a verifying pass is compute-bound (SmolLM2's chat at N=4:
    # 1.12x the tok/s on 0.89x the CPU with 1; stages/engine/speculation.py).
    speculation_max_rows: int | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(int),
        validator=attrs.validators.optional(attrs.validators.ge(0)),
    )
    # Jump-forward: where a row's grammar forces its next tokens (a forced call's markup, a schema's keys), they are
    # verified in one pass rather than decoded a step each; the output is the same
    # (stages/model_thread/jump_forward.py).
    jump_forward: bool = True
    # Bytes the server may plan for: weights, KV and a prefill chunk; 0 is 75% of RAM.
    memory_budget: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    log_level: str = attrs.field(
        default="info",
        converter=_lower,
        validator=attrs.validators.in_(("debug", "info", "warning", "error", "critical")),
    )
    # How log lines are written (pipeline/logs.py): "console" lines for a person, "json" for a log shipper, or
    # "auto": console where stderr is a terminal, JSON elsewhere. Workers write as the front chose.
    log_format: str = attrs.field(default="auto", converter=_lower, validator=lambda _s, _a, value: _log_format(value))
    # Where Responses API results live: unset for memory, sqlite:///path (one host), or
    # postgresql://user@host/db (replicas on several hosts; the `postgres` extra).
    response_store: str | None = None
    response_store_ttl: float = attrs.field(default=24 * 3600.0, validator=attrs.validators.gt(0.0))
    response_store_bytes: int = attrs.field(default=256 * 2**20, validator=_positive)
    # A store that will not open is moved aside (`<name>.corrupt-<time>`) and a fresh one made.
    reset_store: bool = False
    # The HTTP edge (edge/guard.py). Keys: "k1,k2" or "@/path/to/file" (one key a line); unset: no auth.
    api_key: str | None = attrs.field(default=None, repr=False)
    # Origins allowed to call from a browser, comma-separated ("https://app.example"); unset: none.
    cors_origins: str | None = None
    max_body_bytes: int = attrs.field(default=8 * 2**20, validator=_positive)
    # Unknown request fields are a 400 naming them, instead of served and reported (wire/field_policy.py).
    strict_fields: bool = False
    # URL prefixes of the remote MCP servers a request's `mcp` tools may name, comma-separated; unset: none
    # (edge/mcp_tools.py). The server calls them for the client, so nothing is allowed by default.
    mcp_allow: str | None = None
    # Seconds a request body may take to arrive before a 408.
    body_timeout: float = attrs.field(default=60.0, validator=attrs.validators.gt(0.0))

    # Embeddings from the chat model: its last hidden states pooled over the input ("mean") or the last token's
    # ("last").
    embedding_pooling: str = attrs.field(
        default="mean", converter=_lower, validator=attrs.validators.in_(("mean", "last"))
    )
    # A dedicated embedding model served beside the chat model, as MLX_RELAY_MODEL takes one
    # (stages/models/embedding.py).
    embedding_model: str | None = None
    # Its pooling when it ships no sentence-transformers Pooling config ("last": decoder embedding models' usual).
    embedding_model_pooling: str = attrs.field(
        default="last", converter=_lower, validator=attrs.validators.in_(("mean", "last"))
    )
    # Sizes its embeddings may be cut to, where its config does not declare them: "any" or "256,512,1024".
    embedding_matryoshka: str | None = None
    # How rerank/score judge with it: "cosine" of embeddings, or "judge" (yes/no, Qwen3-Reranker); unset: cosine
    # when it ships sentence-transformers files, else judge.
    embedding_score: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(("cosine", "judge")))
    )
    # Tokens one embedding input may have (and the context window, whichever is less).
    embedding_max_tokens: int = attrs.field(default=8192, validator=_positive)
    # Images one request may carry (a vision-language model's); more is a 400 naming the first past it.
    max_images: int = attrs.field(default=8, validator=_positive)
    # The largest image file (bytes, as sent or fetched) and picture (width × height pixels) decoded; more is a 400.
    max_image_bytes: int = attrs.field(default=20 * 2**20, validator=_positive)
    max_image_pixels: int = attrs.field(default=40_000_000, validator=_positive)
    # Hosts whose http(s) image URLs are fetched, comma-separated ("*" any public host); unset: none, a 400.
    # Loopback, link-local and private addresses are never fetched.
    image_url_hosts: str | None = None
    # Seconds a fetch of an image URL may take.
    image_url_timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0))
    # Bytes of vision-tower output kept per image for reuse (the encoder cache, LRU); 0 turns it off.
    encoder_cache_bytes: int = attrs.field(default=256 * 2**20, validator=attrs.validators.ge(0))
    # Embedding and score requests waiting for the model thread at once; more wait `admission_timeout`, then 429.
    exclusive_pending: int = attrs.field(default=64, validator=_positive)
    # Tokens one embeddings, rerank or score request may run through the model, summed over its inputs
    # (OpenAI's embeddings bound); a request past it is a 400 naming it.
    exclusive_max_tokens: int = attrs.field(default=300_000, validator=_positive)
    # The share of a decode step's time that embeddings and scores may add while streams run.
    exclusive_share: float = attrs.field(
        default=0.15, validator=attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.le(10.0))
    )
    # Steps between two turns of that work while streams run: 1 lengthens every gap a little, 100 one gap in 100 more.
    exclusive_period: int = attrs.field(default=100, validator=_positive)
    # Speech to text (docs/speech.md): the largest audio file, in bytes (OpenAI's limit), and the longest, in seconds;
    # past either, a 400 naming `file`.
    audio_max_bytes: int = attrs.field(default=25 * 2**20, validator=_positive)
    audio_max_seconds: float = attrs.field(default=600.0, validator=attrs.validators.gt(0.0))
    # One model over the ranks `mlx.launch` started (stages/shard/): "tensor" or "pipeline"; unset: one process.
    shard: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(("tensor", "pipeline")))
    )
    # Seconds a follower rank may be silent before the engine counts it lost (503, requests failed).
    shard_timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0))
    # The model runs in this process, as before model workers (debugging); sharded serving always does.
    in_process: bool = False
    # Seconds a model worker may send nothing while the front waits on it before it counts as hung (then killed). 10,
    # not 2: a false verdict kills every row the worker holds and its prompt cache, and at a load average of 25-32 on
    # two cores a healthy worker was starved past 2 s (docs/benchmarks.md, "Agent replay"); a real hang is rarer.
    worker_heartbeat_timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0.0))
    # Seconds before the first restart of a lost worker; doubled for each restart in a row that serves nothing.
    worker_restart_backoff: float = attrs.field(default=0.5, validator=_non_negative)
    # A spare worker, started and imported before it is needed, which a restart or a model's load takes:
    # "auto" once several models are served or a worker has restarted, "on", "off" (stages/remote/spare.py).
    worker_spare: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "on", "off")))
    # Workers forked from a copy of the front, its imports done, where that is safe (Linux, the CPU backend):
    # "auto", or "off" to spawn each one (stages/remote/zygote.py).
    worker_fork: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "off")))
    # A worker builds llguidance's tokenizer before it is ready (first constrained TTFT under 1 s); off: at first need.
    warm_grammar: bool = True

    # The event loop `mlx-relay serve` runs on: "asyncio", or "uvloop" (the `uvloop` extra), which
    # spends less of the loop's time per streamed token. `hypercorn app:app` takes `-k uvloop` instead.
    loop: str = attrs.field(default="asyncio", converter=_lower, validator=attrs.validators.in_(("asyncio", "uvloop")))

    # Seconds between keepalive frames of a stream that has nothing to send yet
    # (waiting in the queue, or in a long prefill).
    keepalive_interval: float = attrs.field(default=5.0, validator=attrs.validators.gt(0.0))

    # The chat page at `/` (edge/web.py); off, `/` is a 404 like any path no handler owns.
    web: bool = True
    # Seconds a Responses WebSocket may sit with no turn and no frame before the server closes it (1000).
    socket_idle_timeout: float = attrs.field(default=900.0, validator=attrs.validators.gt(0.0))
    # Files and batches (docs/apis.md, "Files and batches"): the folder of uploads and batch state (unset: `files/`
    # beside a sqlite:// Responses store, else a temporary folder that lives as long as the server, as the memory
    # store does), an upload's byte cap and the files held at most.
    files_dir: str | None = None
    files_max_bytes: int = attrs.field(default=200 * 2**20, validator=_positive)
    files_max_count: int = attrs.field(default=1000, validator=_positive)
    # Batch lines are sent only while fewer than `batch_live_limit` live requests run or wait, and at most
    # `batch_rows` at a time, so a live request finds room in the batch beside them.
    batch_live_limit: int = attrs.field(default=2, validator=_positive)
    batch_rows: int = attrs.field(default=2, validator=_positive)
    # Seconds a batch's "24h" completion window lasts; a test shortens it (0: every batch is past its window).
    batch_window: float = attrs.field(default=24 * 3600.0, validator=attrs.validators.ge(0.0))

    @property
    def model_in_process(self) -> bool:
        """The model runs in the HTTP process (`in_process`, or sharded: DESIGN.md, "Model workers")."""
        return self.in_process or self.shard is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from the environment.

        Raises:
            SettingsError: a variable has a value of the wrong type or range.
        """
        env = os.environ if environ is None else environ
        refuse_unknown(env, {PREFIX + field.name.upper() for field in attrs.fields(cls)} | OTHER_VARIABLES)
        values: dict[str, object] = {}
        for field in attrs.fields(cls):
            raw = env.get(PREFIX + field.name.upper())
            # An empty optional variable is an unset one (`MLX_RELAY_MODEL=` serves the built-in model).
            if raw == "" and field.default is None:
                continue
            if raw is not None:
                values[field.name] = convert(field.name, raw, parser(field.default))
        # An explicit step budget is the target itself, unless a ratio is asked for too.
        values.setdefault("step_budget_ratio", 0.0 if "step_budget_ms" in values else 2.0)
        try:
            return cls(**values)  # type: ignore[arg-type]
        except ValueError as error:
            raise SettingsError(f"invalid {PREFIX}* setting: {error}") from None


def _one_drafter(settings: Settings, draft_model: str | None) -> None:
    if draft_model and settings.prompt_lookup:
        raise ValueError(f"MLX_RELAY_PROMPT_LOOKUP=1 with MLX_RELAY_DRAFT_MODEL={draft_model}: choose one drafter")


WEIGHT_FORMS = ("auto", "float32", "bfloat16", "float16", "stored")


def _weights_form(settings: Settings, value: str) -> None:
    if value not in WEIGHT_FORMS:
        raise ValueError(f"MLX_RELAY_WEIGHTS={value!r} is not one of {', '.join(WEIGHT_FORMS)}")
    if settings.keep_quantized and value not in ("auto", "stored"):
        raise ValueError(f"MLX_RELAY_KEEP_QUANTIZED=1 (weights as stored) contradicts MLX_RELAY_WEIGHTS={value}")


def _log_format(value: str) -> None:
    if value not in LOG_FORMATS:
        raise ValueError(f"MLX_RELAY_LOG_FORMAT={value!r} (--log-format) is not one of {', '.join(LOG_FORMATS)}")


def _check_aliases(value: str | None) -> None:
    parse_aliases(value)


def parse_aliases(value: str | None) -> dict[str, str]:
    """`MLX_RELAY_MODEL_ALIASES`: "alias=served_id" pairs, comma-separated.

    Raises:
        ValueError: an entry is not `name=target`, or an alias is given twice.
    """
    aliases: dict[str, str] = {}
    for entry in (value or "").split(","):
        if not entry.strip():
            continue
        alias, sep, target = (part.strip() for part in entry.partition("="))
        if not sep or not alias or not target:
            raise ValueError(f"model_aliases entry {entry.strip()!r} is not alias=served_id")
        if alias in aliases:
            raise ValueError(f"model_aliases names {alias!r} twice")
        aliases[alias] = target
    return aliases
