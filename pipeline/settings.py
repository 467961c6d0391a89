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
    log_level: str = "info"

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
