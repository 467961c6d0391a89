"""`GET /metrics`: the `/stats` snapshot in Prometheus' text format.

Every number in the snapshot becomes one gauge named by its path
(`gateway.active` → `mlx_relay_gateway_active`); booleans are 0 or 1;
strings and missing values are left out. Pure; no I/O.
"""

from __future__ import annotations

import math
import re

from pipeline.requests import JsonValue

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PREFIX = "mlx_relay"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def render(snapshot: JsonValue) -> str:
    lines: list[str] = []
    for name, value in _numbers(snapshot, _PREFIX):
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name} {value}")
    return "".join(f"{line}\n" for line in lines)


def _numbers(value: JsonValue, name: str) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [pair for key, child in value.items() for pair in _numbers(child, f"{name}_{_UNSAFE.sub('_', key)}")]
    if isinstance(value, bool):
        return [(name, "1" if value else "0")]
    if isinstance(value, (int, float)) and math.isfinite(value):
        return [(name, repr(value) if isinstance(value, float) else str(value))]
    return []
