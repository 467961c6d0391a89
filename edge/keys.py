"""API keys and browser origins, read from their settings once at start-up.

`MLX_RELAY_API_KEY` is either keys separated by commas (`k1,k2`) or `@`
followed by a file path, the file holding one key a line (blank lines and
lines starting with `#` are skipped). Surrounding whitespace is dropped
either way. A key is compared in constant time against every configured
key, so timing says nothing about which key or how much of one matched.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.env_values import SettingsError

_BEARER = "bearer "


def load_keys(spec: str | None) -> tuple[bytes, ...]:
    """The keys `spec` names; () when unset, which turns authentication off.

    Raises:
        SettingsError: the key file cannot be read, or `spec` names no key.
    """
    if spec is None or not spec.strip():
        return ()
    if spec.startswith("@"):
        try:
            lines = Path(spec[1:]).expanduser().read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            raise SettingsError(f"MLX_RELAY_API_KEY: cannot read the key file: {reason}") from None
        keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    else:
        keys = [part.strip() for part in spec.split(",") if part.strip()]
    if not keys:
        raise SettingsError("MLX_RELAY_API_KEY names no key")
    return tuple(key.encode() for key in keys)


def presented_key(authorization: str | None, api_key: str | None) -> str | None:
    """The key a client sent: `Authorization: Bearer <key>` (OpenAI SDKs) or `x-api-key` (Anthropic SDKs)."""
    if authorization and authorization[: len(_BEARER)].lower() == _BEARER:
        return authorization[len(_BEARER) :].strip()
    return api_key


def key_matches(presented: str, keys: tuple[bytes, ...]) -> bool:
    candidate = presented.encode()
    # Every key is compared, so the time taken does not depend on which one matched.
    matched = [hmac.compare_digest(candidate, key) for key in keys]
    return any(matched)


def load_origins(spec: str | None) -> frozenset[str]:
    """The browser origins allowed by `MLX_RELAY_CORS_ORIGINS` (comma-separated, exact `scheme://host[:port]`).

    Raises:
        SettingsError: an entry is not an origin (a path, `*`, no scheme).
    """
    if spec is None:
        return frozenset()
    origins = [part.strip().rstrip("/") for part in spec.split(",") if part.strip()]
    for origin in origins:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
            raise SettingsError(f"MLX_RELAY_CORS_ORIGINS: {origin!r} is not an origin like https://app.example")
    return frozenset(origins)
