"""The Prometheus rendering of the stats snapshot."""

from __future__ import annotations

import pytest

from pipeline.requests import JsonValue
from wire.metrics import render


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        ({"submitted": 3}, ["mlx_relay_submitted 3"]),
        ({"gateway": {"active": 2, "kv": 1.5}}, ["mlx_relay_gateway_active 2", "mlx_relay_gateway_kv 1.5"]),
        ({"running": True, "dead": False}, ["mlx_relay_running 1", "mlx_relay_dead 0"]),
        ({"model": "m", "last": None, "nan": float("nan")}, []),
        ({"prompt-cache": {"disk.bytes": 7}}, ["mlx_relay_prompt_cache_disk_bytes 7"]),
    ],
    ids=["int", "nested", "bools", "skipped", "unsafe-names"],
)
def test_numbers_become_gauges(snapshot: JsonValue, expected: list[str]) -> None:
    lines = render(snapshot).splitlines()
    assert [line for line in lines if not line.startswith("#")] == expected
    assert [line for line in lines if line.startswith("# TYPE")] == [f"# TYPE {e.split()[0]} gauge" for e in expected]
