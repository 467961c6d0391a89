"""File paths kept out of what the server reports about itself (`/stats`, `/fit`, `/metrics`)."""

from __future__ import annotations

import os
import re

from pipeline.requests import JsonValue

# A Windows drive path; POSIX absolute paths are caught by os.path.isabs.
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_SEPARATORS = re.compile(r"[\\/]")


def without_paths(value: JsonValue) -> JsonValue:
    """`value` with every absolute path (model dir, cache dir, store file, ~/…) cut to its last part.

    A path tells a caller how the host is laid out and who runs it; the
    last part (a model's folder name) is what a person reading /stats needs.
    """
    if isinstance(value, dict):
        return {key: without_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_paths(item) for item in value]
    if isinstance(value, str) and _is_path(value):
        return _SEPARATORS.split(value.rstrip("/\\"))[-1] or "/"
    return value


def _is_path(text: str) -> bool:
    return os.path.isabs(text) or text.startswith("~") or bool(_DRIVE.match(text))
