"""Settings, read once from `MLX_RELAY_*` environment variables.

`hypercorn app:app` takes no application arguments, so the environment is
the configuration. A bad value fails start-up with a message that names
the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

import attrs

PREFIX = "MLX_RELAY_"
T = TypeVar("T")


class SettingsError(ValueError):
    pass


_positive = attrs.validators.gt(0)


def _lower(value: str) -> str:
    return value.lower()

_non_negative = attrs.validators.ge(0.0)


@attrs.frozen(kw_only=True)
class Settings:
    """Every knob of the server; the defaults suit the demo model on a laptop."""

    # A local directory or a Hugging Face repo id; None serves the demo model.
    model: str | None = None
    demo_model: str = "demo"
    model_name: str | None = None
    max_batch: int = attrs.field(default=16, validator=_positive)
    max_pending: int = attrs.field(default=64, validator=attrs.validators.ge(0))
    admission_timeout: float = attrs.field(default=2.0, validator=_non_negative)
    retry_after: float = attrs.field(default=1.0, validator=_non_negative)
    drain_timeout: float = attrs.field(default=30.0, validator=_non_negative)
    prefill_step_size: int = attrs.field(default=512, validator=_positive)
    prepare_concurrency: int = attrs.field(default=2, validator=_positive)
    # Structured-output grammars compiling at once (each can take a core).
    constraint_concurrency: int = attrs.field(default=1, validator=_positive)
    # KV bytes the prompt cache keeps in memory (at most half of what the
    # weights and a prefill chunk leave of the budget); 0 turns it off.
    prompt_cache_bytes: int = attrs.field(default=2**30, validator=attrs.validators.ge(0))
    # Requests that name a session keep their conversation's entries warm longer.
    session_cache: bool = True
    # A folder for the prompt cache's disk tier (unset: no disk tier), and its bound.
    cache_dir: str | None = None
    cache_dir_bytes: int = attrs.field(default=8 * 2**30, validator=_positive)
    # Bytes the server may plan for: weights, KV and a prefill chunk; 0 is 75% of RAM.
    memory_budget: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    log_level: str = attrs.field(
        default="info", converter=_lower, validator=attrs.validators.in_(("debug", "info", "warning", "error", "critical"))
    )
    # Where Responses API results live: unset for memory, or sqlite:///path.
    response_store: str | None = None
    response_store_ttl: float = attrs.field(default=24 * 3600.0, validator=attrs.validators.gt(0.0))
    response_store_bytes: int = attrs.field(default=256 * 2**20, validator=_positive)

    # Seconds between keepalive frames of a stream that has nothing to send yet
    # (waiting in the queue, or in a long prefill).
    keepalive_interval: float = attrs.field(default=5.0, validator=attrs.validators.gt(0.0))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from the environment.

        Raises:
            SettingsError: a variable has a value of the wrong type or range.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field in attrs.fields(cls):
            raw = env.get(PREFIX + field.name.upper())
            # An empty optional variable is an unset one (`MLX_RELAY_MODEL=` serves the demo model).
            if raw == "" and field.default is None:
                continue
            if raw is not None:
                values[field.name] = _convert(field.name, raw, _parser(field.default))
        try:
            return cls(**values)  # type: ignore[arg-type]
        except ValueError as error:
            raise SettingsError(f"invalid {PREFIX}* setting: {error}") from None


def _parser(default: object) -> Callable[[str], object]:
    if isinstance(default, bool):
        return lambda raw: raw.strip().lower() in {"1", "true", "yes", "on"}
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    return str


def _convert(name: str, raw: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(raw)
    except ValueError:
        raise SettingsError(f"{PREFIX}{name.upper()}={raw!r} is not a valid value") from None
