"""stages/models/builtin.py: built-in models chosen by name, SmolLM2 by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.models.loading import resolve_model


def test_unset_serves_smollm2(smollm2_model: Path) -> None:
    info = resolve_model(None)
    assert (info.path, info.name, info.context_window, info.vocab_size) == (
        smollm2_model,
        "mlx-relay/smollm2",
        8192,
        49152,
    )


def test_a_built_in_name_in_model_selects_it(tiny_model: Path) -> None:
    info = resolve_model("tiny")
    assert (info.path, info.name) == (tiny_model, "mlx-relay/tiny")


def test_the_fallback_built_in_serves_when_model_is_unset(tiny_model: Path) -> None:
    assert resolve_model(None, demo="tiny", name="served").name == "served"
    assert resolve_model(None, demo="tiny").path == tiny_model


def test_a_directory_is_served_under_its_path(tiny_model: Path) -> None:
    assert resolve_model(str(tiny_model)).name == str(tiny_model)


def test_an_unknown_built_in_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'huge'.*'smollm2', 'demo', 'tiny'"):
        resolve_model(None, demo="huge")
