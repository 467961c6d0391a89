"""`/fit?model=`'s table of the common Apple machines, from a model directory's config.json and weight files.

The same arithmetic as `mlx-relay models --fit` (stages/models/sku.py's `sku_matrix`): the weights as stored
(what Metal serves), so a model served dequantized on this machine's CPU is still judged by its files.
"""

from __future__ import annotations

import json
from pathlib import Path

from stages.models.load_progress import weight_bytes
from stages.models.sku import Planning, describe, model_shape, sku_matrix


def apple_machines(path: Path, planning: Planning) -> list[dict[str, str | int | bool | None]] | None:
    """One row per Apple machine (`memory_gb`, `fits`, `streams`, `kv_scheme`, `max_context`, `context_window`,
    `verdict` in words); None for a directory whose config.json is missing or has no language model's shape (a
    speech model's)."""
    config = path / "config.json"
    if not config.is_file():
        return None
    try:
        shape = model_shape(json.loads(config.read_text()), weight_bytes(path))
    except (KeyError, TypeError, ValueError):
        return None
    return [
        {
            "memory_gb": row.memory_bytes // 10**9,
            "fits": row.fits,
            "streams": row.streams,
            "kv_scheme": row.kv_scheme,
            "max_context": row.max_context,
            "context_window": row.context_window,
            "weights_bytes": row.weights_bytes,
            "verdict": describe(row),
        }
        for row in sku_matrix(shape, planning)
    ]
