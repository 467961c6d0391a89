"""Which form of the weights the model thread serves: as stored, or dequantized to float32.

On the CPU backend a quantized matmul runs MLX's own kernels, while a
float32 one goes to the BLAS (`blas.py`); on the default SmolLM2 the
float32 weights prefilled many times faster (docs/benchmarks.md, "The
Linux first run"). So a quantized model whose float32 weights fit the
memory plan is served dequantized there, unless `keep_quantized` is set;
on Metal and CUDA the weights stay as stored. A sharded model's ranks
follow rank 0's plan, which prices each rank's float32 slice
(stages/shard/cluster.py `load`).

The float32 size comes from the safetensors headers alone, before any
weight is read, so the memory plan can be made for the form that will be
served.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import attrs

# safetensors' dtype names; quantized matrices are packed into U32.
_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
}


@attrs.frozen
class WeightForm:
    float32: bool
    # What `/stats` and the start-up log name: the form and why.
    description: str


def stored(reason: str) -> WeightForm:
    return WeightForm(float32=False, description=f"as stored ({reason})")


def dequantized(bits: int, float32_bytes: int, *, sliced: bool = False) -> WeightForm:
    """`float32_bytes`: what this process holds (`sliced`: a sharded rank's slice of the model)."""
    held = f"{float32_bytes / 2**30:.2f} GiB{' in this rank' if sliced else ''}"
    return WeightForm(
        float32=True,
        description=f"float32, dequantized from {bits}-bit for the CPU backend ({held}; "
        "MLX_RELAY_KEEP_QUANTIZED=1 keeps them quantized)",
    )


def quantization(path: Path) -> dict[str, Any] | None:
    """A quantized mlx-lm model directory's `quantization` config; None when it is not quantized."""
    config = json.loads((path / "config.json").read_text())
    found = config.get("quantization") or config.get("quantization_config")
    return found if isinstance(found, dict) and isinstance(found.get("bits"), int) else None


def float32_bytes(path: Path, quantized: dict[str, Any]) -> int:
    """The bytes of every weight as float32, once each quantized matrix is unpacked and its scales dropped.

    `quantized` is the model's quantization config: its `bits`, and per-module
    overrides keyed by the module's path (mlx-lm writes the embedding's 8 bits so).
    """
    total = 0
    for file in sorted(path.glob("*.safetensors")):
        tensors = _header(file)
        for name, entry in tensors.items():
            stem, _, kind = name.rpartition(".")
            packed = f"{stem}.scales" in tensors
            if packed and kind in ("scales", "biases"):
                continue
            elements = math.prod(entry["shape"])
            if packed and kind == "weight":
                module = quantized.get(stem)
                bits = int((module if isinstance(module, dict) else quantized)["bits"])
                elements = elements * _DTYPE_BYTES[entry["dtype"]] * 8 // bits
            total += elements * 4
    return total


def _header(file: Path) -> dict[str, dict[str, Any]]:
    with file.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header: dict[str, dict[str, Any]] = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header
