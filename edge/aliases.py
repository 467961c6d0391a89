"""Model aliases (`MLX_RELAY_MODEL_ALIASES`): other names for the one served model.

Checked once the model is loaded (each alias must name it); a request
that asks by an alias is answered under that alias, any other under the
served id. The name asked for travels on the decoded request (`model`).
"""

from __future__ import annotations

import attrs
import structlog

from edge.startup import StartupError
from pipeline.requests import GenerationRequest, JsonValue
from pipeline.settings import Settings, parse_aliases
from stages.messages import Decoder

log = structlog.get_logger()


def checked_aliases(settings: Settings, served: str) -> dict[str, str]:
    """The aliases, each naming `served`.

    Raises:
        StartupError: an alias names another model.
    """
    aliases = parse_aliases(settings.model_aliases)
    wrong = sorted(alias for alias, target in aliases.items() if target != served)
    if wrong:
        reason = f"MLX_RELAY_MODEL_ALIASES maps {wrong[0]!r} to {aliases[wrong[0]]!r}, but this server serves {served!r}"
        log.error("server.cannot_start", reason=reason)
        raise StartupError(reason)
    return aliases


def served_as(aliases: dict[str, str], requested: str | None, served: str) -> str:
    """The model name a reply carries: the alias the client asked by, else the served id."""
    return requested if requested is not None and requested in aliases else served


def with_model(decode: Decoder) -> Decoder:
    """`decode`, keeping the name asked for on the request (for an alias, or Anthropic's echo of any name)."""

    def decode_named(value: JsonValue) -> GenerationRequest:
        decoded = decode(value)
        model = value.get("model") if isinstance(value, dict) else None
        if decoded.model is None and isinstance(model, str):
            return attrs.evolve(decoded, model=model)
        return decoded

    return decode_named
