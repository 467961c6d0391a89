"""Per-model defaults as a request sees them: composed once per load, applied to each decoded request.

Composition, first set wins: the models file (or, for one model, the
MLX_RELAY_DEFAULT_* settings), then the model directory's
`generation_config.json` (temperature, top_p, top_k, min_p,
repetition_penalty, max_new_tokens, as vLLM reads it), then the API's
own default. A request's own value always wins: a default fills only the
fields its body does not carry.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from fleet.spec import Defaults
from pipeline.requests import GenerationRequest, JsonValue
from stages.messages import Decoder

GENERATION_CONFIG = "generation_config.json"
# Every spelling of the output limit across the APIs (Responses: max_output_tokens).
_MAX_TOKENS_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_config(path: Path) -> Defaults:
    """The sampling defaults a model directory ships; none when it has no (readable) generation_config.json."""
    try:
        config = json.loads((path / GENERATION_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Defaults()
    if not isinstance(config, dict):
        return Defaults()

    def number(key: str) -> float | None:
        value = config.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    top_k, max_new = number("top_k"), number("max_new_tokens")
    return Defaults(
        temperature=number("temperature"),
        top_p=number("top_p"),
        top_k=int(top_k) if top_k is not None else None,
        min_p=number("min_p"),
        repetition_penalty=number("repetition_penalty"),
        max_tokens=int(max_new) if max_new is not None and max_new > 0 else None,
    )


def with_defaults(decode: Decoder, defaults: Defaults) -> Decoder:
    """`decode`, then each default the body leaves unset applied (the adapter is the engine's, not here)."""
    sampling = {key: getattr(defaults, key) for key in _SAMPLING if getattr(defaults, key) is not None}
    if not sampling and defaults.max_tokens is None:
        return decode

    def decode_with_defaults(value: JsonValue) -> GenerationRequest:
        request = decode(value)
        body = value if isinstance(value, dict) else {}
        unset = {key: default for key, default in sampling.items() if body.get(key) is None}
        params = request.params
        if unset:
            params = attrs.evolve(params, sampling=attrs.evolve(params.sampling, **unset))
        if defaults.max_tokens is not None and all(body.get(key) is None for key in _MAX_TOKENS_KEYS):
            # A default is a ceiling, not a demand: near the window's end it is cut to fit, never a 400.
            params = attrs.evolve(params, max_tokens=defaults.max_tokens, clamp_max_tokens=True)
        return request if params is request.params else attrs.evolve(request, params=params)

    return decode_with_defaults
