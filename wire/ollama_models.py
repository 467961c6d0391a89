"""Ollama's model reports: `/api/tags`, `/api/show`, `/api/ps`, `/api/version`, and `/api/embed`'s bodies.

Pure: the edge gathers what the fleet knows of each model (`ModelFacts`) and these shape it. The
`digest` is a hash of the served name (this server keeps no Ollama blobs to hash); `size` is the
model's planned footprint where the fleet measured one, else 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import attrs

from pipeline.errors import invalid
from pipeline.requests import JsonObject, JsonValue
from pipeline.work_requests import EmbeddingRequest, Embeddings, EncodingFormat
from wire.field_reads import as_body, as_list, as_str, read_bool, read_int, read_str
from wire.ollama_requests import read_keep_alive, read_params

# The Ollama release whose API this server follows; clients that check a minimum read it.
OLLAMA_VERSION = "0.12.0"
# What Ollama reports as `expires_at` for a model kept loaded (`keep_alive: -1`): far off.
NEVER = "2318-01-01T00:00:00Z"


@attrs.frozen(kw_only=True)
class ModelFacts:
    name: str
    size: int = 0
    family: str = ""
    context_length: int | None = None
    capabilities: tuple[str, ...] = ("completion",)
    template: str = ""
    # Sampling defaults, as a Modelfile's PARAMETER lines name them.
    parameters: Mapping[str, JsonValue] = attrs.field(factory=dict)
    # RFC 3339, or None for a model that stays until evicted.
    expires_at: str | None = None


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def details(facts: ModelFacts) -> JsonObject:
    families: list[JsonValue] = [facts.family] if facts.family else []
    return {
        "parent_model": "",
        "format": "mlx",
        "family": facts.family,
        "families": families,
        "parameter_size": "",
        "quantization_level": "",
    }


def tags_body(models: Sequence[ModelFacts]) -> JsonObject:
    return {"models": [_entry(facts) | {"modified_at": "1970-01-01T00:00:00Z"} for facts in models]}


def ps_body(models: Sequence[ModelFacts]) -> JsonObject:
    return {
        "models": [
            _entry(facts)
            | {"expires_at": facts.expires_at or NEVER, "size_vram": facts.size, "context_length": facts.context_length}
            for facts in models
        ]
    }


def show_body(facts: ModelFacts) -> JsonObject:
    info: JsonObject = {"general.architecture": facts.family}
    if facts.context_length is not None:
        info[f"{facts.family or 'general'}.context_length"] = facts.context_length
    return {
        "modelfile": f"FROM {facts.name}\n",
        "parameters": "\n".join(f"{key} {value}" for key, value in facts.parameters.items()),
        "template": facts.template,
        "details": details(facts),
        "model_info": info,
        "capabilities": list(facts.capabilities),
        "modified_at": "1970-01-01T00:00:00Z",
    }


def embed_body(result: Embeddings, *, model: str, total_ns: int) -> JsonObject:
    vectors: list[JsonValue] = [list(vector) for vector in result.vectors]
    return {
        "model": model,
        "embeddings": vectors,
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": result.prompt_tokens,
    }


def decode_ollama_embed(value: JsonValue) -> EmbeddingRequest:
    """`/api/embed`'s `input` (a string or an array of strings), or `/api/embeddings`' one `prompt`."""
    body = as_body(value)
    # Read for their checks: options that would change output are refused, keep_alive is the route's.
    read_params(body)
    read_keep_alive(body)
    # Ollama cuts an input past the window under `truncate` (its default); this server refuses it, 400 naming it.
    read_bool(body, "truncate")
    raw: list[JsonValue]
    if "prompt" in body and "input" not in body:
        raw = [as_str(body.get("prompt"), "prompt")]
    else:
        given = body.get("input")
        raw = [given] if isinstance(given, str) else as_list(given, "input")
    inputs = tuple(as_str(item, f"input[{index}]") for index, item in enumerate(raw))
    if not inputs or not all(inputs):
        raise invalid("'input' must hold at least one non-empty string", param="input")
    return EmbeddingRequest(
        model=read_str(body, "model"),
        inputs=inputs,
        encoding_format=EncodingFormat.FLOAT,
        dimensions=read_int(body, "dimensions", minimum=1),
    )


def _entry(facts: ModelFacts) -> JsonObject:
    return {
        "name": facts.name,
        "model": facts.name,
        "size": facts.size,
        "digest": digest(facts.name),
        "details": details(facts),
    }
