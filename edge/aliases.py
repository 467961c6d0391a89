"""Model aliases (`MLX_RELAY_MODEL_ALIASES`): other names for a served model id.

Checked once the model is loaded (each alias must name the base model or
one of its adapters; `ServedModels` resolves them); a request that asks
by an alias is answered under that alias, any other under the id of the
model that answered. The name asked for travels on the decoded request (`model`).
Embeddings and scores run on the base model only, so they answer under
the alias or base id asked by, and refuse an adapter rather than ignore it.
"""

from __future__ import annotations

import attrs
import structlog

from pipeline.errors import invalid
from pipeline.requests import GenerationRequest, JsonValue
from stages.adapters import ServedModels, not_found
from stages.messages import Decoder
from store.store_startup import StartupError

log = structlog.get_logger()


def check_aliases(served: ServedModels) -> None:
    """Each alias names a served id.

    Raises:
        StartupError: an alias names a model this server does not serve.
    """
    aliases = served.aliases
    wrong = sorted(alias for alias, target in aliases.items() if target not in served.ids)
    if wrong:
        ids = ", ".join(repr(model_id) for model_id in served.ids)
        reason = f"MLX_RELAY_MODEL_ALIASES maps {wrong[0]!r} to {aliases[wrong[0]]!r}, but this server serves {ids}"
        log.error("server.cannot_start", reason=reason)
        raise StartupError(reason)


def served_as(served: ServedModels, request: GenerationRequest) -> str:
    """The model name a reply carries: the alias the client asked by, else the id that answered (an adapter's or the
    base model's)."""
    if request.model is not None and (request.model in served.aliases or request.model == served.base):
        # Asked by the base model's name, a default adapter answers under that name.
        return request.model
    return request.params.adapter or served.base


def work_served_as(served: ServedModels, model: str | None) -> str:
    """The model name an embeddings, rerank or score reply carries: the alias asked by, else the base id.

    Raises:
        RequestError: 400 `model_not_supported` for an adapter (or an alias of
            one): this work runs on the base model, and the adapter would
            change its answer; 404 `model_not_found` for a name this server
            does not serve, where it serves adapters (as generation does).
    """
    if not model:
        return served.base
    target = served.aliases.get(model, model)
    if target in served.ids[1:]:
        raise invalid(
            f"The model `{model[:200]}` is a LoRA adapter; embeddings and scores come from the base model only: "
            f"ask for `{served.base}`",
            param="model",
            code="model_not_supported",
        )
    if served.adapters and not served.knows(model):
        raise not_found(model, "model", served=(*served.ids, *served.aliases))
    return model if model in served.aliases else served.base


def with_model(decode: Decoder) -> Decoder:
    """`decode`, keeping the name asked for on the request (for an alias, or Anthropic's echo of any name)."""

    def decode_named(value: JsonValue) -> GenerationRequest:
        decoded = decode(value)
        model = value.get("model") if isinstance(value, dict) else None
        if decoded.model is None and isinstance(model, str):
            return attrs.evolve(decoded, model=model)
        return decoded

    return decode_named
