"""`/fit?model=` carries the common Apple machines' table, as `mlx-relay models --fit` prints it."""

from __future__ import annotations

from stages.models.sku import APPLE_MEMORY_GB
from tests import loopback
from tests.conftest import Server


def check_table(rows: list[dict[str, object]], *, weights_bytes: int) -> None:
    """One row per machine, smallest first; a machine that fits one model fits it on every larger one."""
    assert [row["memory_gb"] for row in rows] == list(APPLE_MEMORY_GB)
    assert all(row["weights_bytes"] == weights_bytes and isinstance(row["verdict"], str) for row in rows)
    fits = [bool(row["fits"]) for row in rows]
    assert fits == sorted(fits)
    streams = [int(str(row["streams"])) for row in rows]
    assert streams == sorted(streams)


def test_fit_of_the_served_model_has_the_apple_table(server: Server, tiny_model: object) -> None:
    from stages.models.demo import ensure_demo_model
    from stages.models.load_progress import weight_bytes

    body = loopback.get(f"{server.base_url}/fit", params={"model": "mlx-relay/tiny"}, timeout=30.0).json()
    rows = body["apple_machines"]
    check_table(rows, weights_bytes=weight_bytes(ensure_demo_model("tiny")))
    # The tiny model fits every machine, with streams at its whole window in full precision.
    assert all(row["fits"] and row["streams"] and row["kv_scheme"] == "full" for row in rows)
    assert rows[0]["verdict"].startswith("fits: ")
    # Without `model`, /fit is this machine's plan alone; another name is a 404.
    assert "apple_machines" not in loopback.get(f"{server.base_url}/fit", timeout=30.0).json()
    missing = loopback.get(f"{server.base_url}/fit", params={"model": "nope"}, timeout=30.0)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
