"""What each served model is: read from a models file (TOML) or from the single-model settings.

A models file names each model under `[models.<name>]`; the name is the id
clients ask for. Every key is checked (a misspelt one is an error, never
ignored), so a typo cannot silently serve a model other than the one meant:

    [models.chat]
    model = "smollm2"          # a built-in, a directory, an HF repo id or shaped:NAME
    aliases = ["default"]
    adapters = { support = "/adapters/support" }
    embedding_model = "shaped:qwen3-embedding-0.6b"   # a dedicated embedding model beside it
    pinned = true              # loaded at start, never unloaded
    ttl = 600                  # seconds idle before it unloads (unset: stays until evicted)
    [models.chat.kv]
    memory_budget = 4294967296 # bytes this model may plan for: weights, KV, prefill, prompt cache
    context = 8192             # or: the tokens of KV it reserves (its budget is planned from it)
    prompt_cache_bytes = 536870912
    max_batch = 8
    kv_bits = 8                # a quantized KV cache for this model (4 or 8; unset: the server's MLX_RELAY_KV_BITS)
    kv_group_size = 64
    quantized_kv_start = 0
    [models.chat.defaults]
    temperature = 0.7          # unset: the model's generation_config.json, else the API's default
    top_p = 0.9
    top_k = 40
    max_tokens = 512
    adapter = "support"
    context_limit = 4096       # a context window below the model's own
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from pipeline.requests import JsonValue
from pipeline.settings import Settings, parse_aliases
from stages.models.builtin import BUILTIN_MODELS

_SHAPED = "shaped:"


class ModelsFileError(ValueError):
    """A models file (or model list) that cannot be served, told in one line."""


@attrs.frozen(kw_only=True)
class Defaults:
    """Per-model defaults a request's own value always overrides; None: not set here."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    adapter: str | None = None
    context_limit: int | None = None

    def over(self, fallback: Defaults) -> Defaults:
        """These defaults, each unset one taken from `fallback`."""
        mine = attrs.asdict(self)
        return Defaults(
            **{
                key: fallback_value if mine[key] is None else mine[key]
                for key, fallback_value in attrs.asdict(fallback).items()
            }
        )

    def shown(self) -> dict[str, JsonValue]:
        return {key: value for key, value in attrs.asdict(self).items() if value is not None}


@attrs.frozen(kw_only=True)
class KvSpec:
    """The model's share of the machine: a whole budget, or the KV tokens to plan one from."""

    memory_budget: int | None = None
    context: int | None = None
    prompt_cache_bytes: int | None = None
    max_batch: int | None = None
    # The model's KV scheme (MLX_RELAY_KV_BITS and friends for it alone); unset: the server's.
    kv_bits: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.in_((4, 8))))
    kv_group_size: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_((32, 64, 128)))
    )
    quantized_kv_start: int | None = None


@attrs.frozen(kw_only=True)
class ModelSpec:
    name: str
    # What MLX_RELAY_MODEL takes: a built-in, a directory, an HF repo id or shaped:NAME.
    source: str | None
    aliases: tuple[str, ...] = ()
    # "name=path,..." as MLX_RELAY_ADAPTERS takes them.
    adapters: str | None = None
    embedding_model: str | None = None
    pinned: bool = False
    ttl: float | None = None
    kv: KvSpec = KvSpec()
    defaults: Defaults = Defaults()


def served_name(source: str) -> str:
    """The id a model is served under when no name is given, as `resolve_model` names it."""
    return f"mlx-relay/{source}" if source in BUILTIN_MODELS or source.startswith(_SHAPED) else source


def specs_from_settings(settings: Settings) -> tuple[ModelSpec, ...]:
    """The models to serve: the models file's, a comma list's, or the one model of the settings.

    Raises:
        ModelsFileError: the file or list cannot be served (unreadable, a bad key, a name twice).
    """
    if settings.models_file:
        return read_models_file(Path(settings.models_file).expanduser())
    sources = [part.strip() for part in (settings.model or "").split(",") if part.strip()]
    if len(sources) <= 1:
        return (_single(settings),)
    return _listed(sources, settings)


def _single(settings: Settings) -> ModelSpec:
    """Today's one model: its settings are the engine's own, unchanged; pinned, so it loads at start."""
    defaults = Defaults(
        temperature=settings.default_temperature,
        top_p=settings.default_top_p,
        top_k=settings.default_top_k,
        max_tokens=settings.default_max_tokens,
        adapter=settings.default_adapter,
        context_limit=settings.context_limit,
    )
    name = settings.model_name or served_name(settings.model or settings.demo_model)
    return ModelSpec(name=name, source=settings.model, pinned=True, defaults=defaults)


def _listed(sources: list[str], settings: Settings) -> tuple[ModelSpec, ...]:
    """`--model tiny --model demo`: each served under its usual id, a built-in also by its bare name."""
    if settings.adapters or settings.embedding_model:
        raise ModelsFileError(
            "with several models, give adapters and embedding models to one of them in a models file "
            "(MLX_RELAY_MODELS_FILE; docs/models.md)"
        )
    aliases = parse_aliases(settings.model_aliases)
    specs = []
    for source in sources:
        name = served_name(source)
        own = tuple(alias for alias, target in aliases.items() if target == name)
        bare = (source,) if name != source and source not in aliases else ()
        specs.append(ModelSpec(name=name, source=source, aliases=(*bare, *own), pinned=False))
    return _checked(tuple(specs))


def read_models_file(path: Path) -> tuple[ModelSpec, ...]:
    """Every model of a models file, in the file's order.

    Raises:
        ModelsFileError: unreadable, not TOML, or a model that cannot be served as written.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ModelsFileError(f"models file {path}: cannot be read ({error})") from None
    except tomllib.TOMLDecodeError as error:
        raise ModelsFileError(f"models file {path}: not TOML ({error})") from None
    return parse_models(document, where=str(path))


def parse_models(document: Mapping[str, Any], *, where: str = "models file") -> tuple[ModelSpec, ...]:
    _only(document, {"models"}, where)
    models = document.get("models")
    if not isinstance(models, dict) or not models:
        raise ModelsFileError(f"{where}: needs at least one [models.<name>] table")
    return _checked(tuple(_model(name, table, f"{where}: [models.{name}]") for name, table in models.items()))


_MODEL_KEYS = {"model", "aliases", "adapters", "embedding_model", "pinned", "ttl", "kv", "defaults"}
_KV_TYPES: dict[str, type] = {
    "memory_budget": int,
    "context": int,
    "prompt_cache_bytes": int,
    "max_batch": int,
    "kv_bits": int,
    "kv_group_size": int,
    "quantized_kv_start": int,
}
_DEFAULT_TYPES: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
    "max_tokens": int,
    "adapter": str,
    "context_limit": int,
}


def _model(name: str, table: Any, where: str) -> ModelSpec:
    if not isinstance(table, dict):
        raise ModelsFileError(f"{where} must be a table")
    _only(table, _MODEL_KEYS, where)
    adapters = _typed(table, "adapters", dict, where) or {}
    if not all(isinstance(path, str) for path in adapters.values()):
        raise ModelsFileError(f"{where}: adapters maps each adapter's name to its folder (a string)")
    ttl = _typed(table, "ttl", float, where)
    if ttl is not None and ttl <= 0:
        raise ModelsFileError(f"{where}: ttl must be a positive number of seconds")
    aliases = _typed(table, "aliases", list, where) or []
    if not all(isinstance(alias, str) and alias for alias in aliases):
        raise ModelsFileError(f"{where}: aliases must be a list of names")
    return ModelSpec(
        name=name,
        source=_typed(table, "model", str, where) or name,
        aliases=tuple(aliases),
        adapters=",".join(f"{adapter}={path}" for adapter, path in adapters.items()) or None,
        embedding_model=_typed(table, "embedding_model", str, where),
        pinned=bool(_typed(table, "pinned", bool, where)),
        ttl=ttl,
        kv=_kv(table, where),
        defaults=Defaults(**_section(table, "defaults", _DEFAULT_TYPES, where)),
    )


def _kv(table: Mapping[str, Any], where: str) -> KvSpec:
    values = _section(table, "kv", _KV_TYPES, where)
    try:
        return KvSpec(**values)
    except ValueError as error:
        raise ModelsFileError(f"{where}.kv: kv_bits must be 4 or 8 and kv_group_size 32, 64 or 128 ({error})") from None


def _section(table: Mapping[str, Any], key: str, types: dict[str, type], where: str) -> dict[str, Any]:
    section = table.get(key, {})
    if not isinstance(section, dict):
        raise ModelsFileError(f"{where}.{key} must be a table")
    _only(section, set(types), f"{where}.{key}")
    values = {name: _typed(section, name, kind, f"{where}.{key}") for name, kind in types.items()}
    for name, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ModelsFileError(f"{where}.{key}: {name} must not be negative")
    return values


def _typed(table: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = table.get(key)
    if value is None:
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ModelsFileError(f"{where}: {key} must be {_KIND_NAMES[kind]}, not {value!r}")
    return value


_KIND_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "a table",
}


def _only(table: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ModelsFileError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _checked(specs: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
    """Every name a client may ask by (model, alias, adapter) names one model only."""
    owner: dict[str, str] = {}
    for spec in specs:
        adapter_names = [item.partition("=")[0].strip() for item in (spec.adapters or "").split(",") if item.strip()]
        for asked in (spec.name, *spec.aliases, *adapter_names):
            if asked in owner:
                raise ModelsFileError(f"the name {asked!r} is given to both {owner[asked]!r} and {spec.name!r}")
            owner[asked] = spec.name
        if spec.defaults.adapter is not None and spec.defaults.adapter not in adapter_names:
            raise ModelsFileError(
                f"model {spec.name!r}: its default adapter {spec.defaults.adapter!r} is not one of its adapters"
            )
    return specs
