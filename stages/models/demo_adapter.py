"""Random LoRA adapters for a model directory, in mlx-lm's adapter format.

Nothing is trained: the adapter's A matrices start as `mlx_lm.lora` starts
them and its B matrices, which training would have moved off zero, are
drawn at random (seeded), so the adapter changes the model's outputs.
Tests and benchmarks serve these beside the demo models; the files are
exactly what `mlx_lm.lora` saves and `mlx_lm.load(adapter_path=...)` reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from stages.adapters import CONFIG, WEIGHTS


def write_random_adapter(
    model_path: Path,
    out: Path,
    *,
    seed: int,
    rank: int = 4,
    scale: float = 10.0,
    num_layers: int = -1,
    spread: float = 0.05,
) -> Path:
    """Write `out/adapter_config.json` and `out/adapters.safetensors` for the model at `model_path`; return `out`.

    `num_layers` -1 adapts every layer, as `mlx_lm.lora --num-layers -1` does.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load_model

    model, _ = load_model(model_path)
    layers = len(model.layers) if num_layers < 0 else num_layers
    lora = {"rank": rank, "scale": scale, "dropout": 0.0}
    mx.random.seed(seed)
    linear_to_lora_layers(model, layers, lora)
    weights: dict[str, mx.array] = {}
    parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    for name, value in parameters:
        if name.endswith(".lora_a"):
            weights[name] = value
        elif name.endswith(".lora_b"):
            weights[name] = mx.random.normal(value.shape, dtype=value.dtype) * spread
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / WEIGHTS), weights)
    config = {"fine_tune_type": "lora", "num_layers": layers, "lora_parameters": lora, "model": str(model_path)}
    (out / CONFIG).write_text(json.dumps(config, indent=2))
    return out
