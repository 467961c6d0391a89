"""Reading one `MLX_RELAY_*` variable: the words a boolean takes, a value parsed by its default's type, and the
refusal of a name no setting has (pipeline/settings.py holds the settings themselves)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import TypeVar

PREFIX = "MLX_RELAY_"
T = TypeVar("T")


class SettingsError(ValueError):
    pass


TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def refuse_unknown(env: Mapping[str, str], known: set[str]) -> None:
    unknown = sorted(name for name in env if name.startswith(PREFIX) and name not in known)
    if not unknown:
        return
    name = unknown[0]
    # Compared without the prefix, which every name shares.
    close = difflib.get_close_matches(name.removeprefix(PREFIX), sorted(k.removeprefix(PREFIX) for k in known), n=1)
    hint = f" (did you mean {PREFIX}{close[0]}?)" if close else f" (known: {', '.join(sorted(known))})"
    raise SettingsError(f"{name} is not a setting of this server{hint}")


def boolean(raw: str) -> bool:
    word = raw.strip().lower()
    if word not in TRUE_WORDS | FALSE_WORDS:
        raise ValueError(raw)
    return word in TRUE_WORDS


def parser(default: object) -> Callable[[str], object]:
    if isinstance(default, bool):
        return boolean
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    return str


def convert(name: str, raw: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(raw)
    except ValueError:
        expected = " (expected one of: 1, true, yes, on, 0, false, no, off)" if parse is boolean else ""
        raise SettingsError(f"{PREFIX}{name.upper()}={raw!r} is not a valid value{expected}") from None
