"""The float32 size the memory plan uses is what dequantizing really holds."""

from __future__ import annotations

from pathlib import Path

import attrs
import mlx.core as mx
from mlx.utils import tree_flatten

from stages.models.loading import load_weights, resolve_model
from stages.models.weights import float32_bytes, quantization


def test_the_float32_size_from_the_headers_is_the_dequantized_models(smollm2_model: Path) -> None:
    quantized = quantization(smollm2_model)
    assert quantized is not None and quantized["bits"] == 4
    model = load_weights(attrs.evolve(resolve_model("smollm2"), float32_weights=True))
    parameters = tree_flatten(model.parameters())  # type: ignore[attr-defined]
    assert {array.dtype for _, array in parameters} == {mx.float32}
    assert float32_bytes(smollm2_model, quantized) == sum(array.nbytes for _, array in parameters)


def test_a_model_stored_in_float_is_not_quantized(tiny_model: Path) -> None:
    assert quantization(tiny_model) is None
