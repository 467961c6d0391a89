"""Fixtures for the stage tests: the tiny demo model, loaded the way the server loads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.models.loading import ModelInfo, Tokenizer, load_tokenizer, resolve_model


@pytest.fixture(scope="session")
def model_info(tiny_model: Path) -> ModelInfo:
    return resolve_model(str(tiny_model))


@pytest.fixture(scope="session")
def tokenizer(model_info: ModelInfo) -> Tokenizer:
    """mlx-lm's TokenizerWrapper for the tiny demo model, as the engine builds it."""
    return load_tokenizer(model_info)
