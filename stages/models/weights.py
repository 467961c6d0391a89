"""Which form of the weights the model thread serves: as stored, or dequantized to float32 or 16 bits.

On the CPU backend a quantized matmul runs MLX's own kernels, while a
float32 one goes to the BLAS (`blas.py`) and a 16-bit one to MLX's own
16-bit kernels; both ran many times faster than the quantized ones
(docs/memory.md, "The weights' form"). Which form is served is
`stages/engine/weight_forms.py`'s choice (`MLX_RELAY_WEIGHTS`); on Metal
and CUDA the weights stay as stored unless it names another. A sharded
model's ranks follow rank 0's plan, which prices each rank's float32 slice
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


SIXTEEN_BIT = ("bfloat16", "float16")


@attrs.frozen(kw_only=True)
class WeightOption:
    """One form's memory plan, as `/fit` reports it beside the chosen one."""

    form: str
    weights_bytes: int
    kv_bytes_per_token: int
    # The longest context one row can be served at in this form; 0 when the budget cannot hold it.
    max_safe_context: int
    # Whether that is the whole window (the model's, or MLX_RELAY_CONTEXT_LIMIT's).
    admits_window: bool
    # Decode and prefill speed relative to the weights as stored, as measured on MLX's CPU backend
    # (stages/engine/weight_forms.py); None on Metal and CUDA, where they were not measured.
    relative_decode_speed: float | None
    relative_prefill_speed: float | None


@attrs.frozen(kw_only=True)
class WeightForm:
    # "float32", "bfloat16", "float16" (dequantized to that type) or "stored".
    served: str
    # What `/stats` and the start-up log name: the form and why.
    description: str
    # Every form's plan, for `/fit`; empty for a model that is not quantized.
    options: tuple[WeightOption, ...] = ()

    @property
    def float32(self) -> bool:
        return self.served == "float32"

    @property
    def sixteen_bit(self) -> str | None:
        """The 16-bit type the weights are dequantized to; None when float32 or as stored."""
        return self.served if self.served in SIXTEEN_BIT else None


def stored(reason: str, options: tuple[WeightOption, ...] = ()) -> WeightForm:
    return WeightForm(served="stored", description=f"as stored ({reason})", options=options)


def dequantized(
    bits: int,
    served_bytes: int,
    *,
    sliced: bool = False,
    dtype: str = "float32",
    why: str = "for the CPU backend",
    options: tuple[WeightOption, ...] = (),
) -> WeightForm:
    """`served_bytes`: what this process holds (`sliced`: a sharded rank's slice of the model) in `dtype`."""
    held = f"{served_bytes / 2**30:.2f} GiB{' in this rank' if sliced else ''}"
    return WeightForm(
        served=dtype,
        description=f"{dtype}, dequantized from {bits}-bit {why} ({held}; MLX_RELAY_WEIGHTS=stored keeps them "
        "quantized)",
        options=options,
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
