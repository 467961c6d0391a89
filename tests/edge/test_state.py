"""The app's state (edge/state.py): one typed object per app, and a loud failure when read before the start."""

from __future__ import annotations

import pytest
from quart import Quart

from edge.state import NotStarted, install, state_of


def test_the_state_is_the_one_installed_on_that_app() -> None:
    first, second = Quart("first"), Quart("second")
    installed = install(first, blas="accelerate")
    install(second, blas="openblas")
    assert state_of(first) is installed and state_of(first).blas == "accelerate"
    assert state_of(second).blas == "openblas"


def test_what_the_lifespan_makes_cannot_be_read_before_it_has_run() -> None:
    state = install(Quart("app"), blas="openblas")
    assert state.serving is None
    with pytest.raises(NotStarted, match="before the server started"):
        _ = state.running
