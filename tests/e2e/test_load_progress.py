"""A model being loaded says how far it has got, in `/v1/models` and `/health`, not only "loading".

The fleet serves the tiny model and the shape-true Qwen3-0.6B (28 layers, 240 MB of weights: a load long
enough to watch), which loads on its first request. While that request waits, the reports are read as fast
as they answer: every report of the loading model carries its phase (stages/models/load_progress.py), the
phases move forward only, and a ready model carries none. No timing is asserted: a report that never
caught the load at all fails, since a load this size takes far longer than one report.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from stages.models.load_progress import PHASES, weight_bytes
from stages.models.shaped import ensure_shaped_model
from tests import loopback
from tests.conftest import ServerFactory
from tests.e2e.test_fit_table import check_table

pytestmark = pytest.mark.slow
BIG = "mlx-relay/shaped:qwen3-0.6b"


def _watch(base_url: str, done: threading.Event) -> list[tuple[str, dict[str, Any]]]:
    """(route, the big model's report) for every report read until `done`, loading or not."""
    seen: list[tuple[str, dict[str, Any]]] = []
    while not done.is_set():
        cards = loopback.get(f"{base_url}/v1/models", timeout=10.0).json()["data"]
        seen.append(("models", next(card for card in cards if card["id"] == BIG)))
        seen.append(("health", loopback.get(f"{base_url}/health", timeout=10.0).json()["models"][BIG]))
    return seen


def test_a_loading_model_reports_its_phase(server_factory: ServerFactory) -> None:
    # Kept 4-bit: dequantizing to float32 (this backend's default form) would add seconds and no phase.
    fleet = server_factory(model="tiny,shaped:qwen3-0.6b", private=True, weights="stored")
    before = loopback.get(f"{fleet.base_url}/health", timeout=10.0).json()["models"][BIG]
    assert before["state"] == "unloaded" and "loading" not in before
    # An unloaded model's /fit has the Apple machines' table too, from its files alone.
    unloaded_fit = loopback.get(f"{fleet.base_url}/fit", params={"model": BIG}, timeout=60.0).json()
    check_table(unloaded_fit["apple_machines"], weights_bytes=weight_bytes(ensure_shaped_model("qwen3-0.6b")))
    done = threading.Event()
    answers: list[int] = []

    def ask() -> None:
        body = {"model": BIG, "prompt": "hi", "max_tokens": 1}
        answers.append(loopback.post(f"{fleet.v1}/completions", json=body, timeout=300.0).status_code)
        done.set()

    asking = threading.Thread(target=ask)
    asking.start()
    seen = _watch(fleet.base_url, done)
    asking.join()
    assert answers == [200]
    loading = [(route, report) for route, report in seen if report["state"] == "loading"]
    assert {route for route, _ in loading} == {"models", "health"}, seen
    for _, report in loading:
        progress = report["loading"]
        assert progress["phase"] in PHASES and 0 <= progress["phase_s"] <= progress["elapsed_s"]
        if progress["phase"] == "reading weights":
            assert progress["weights_bytes"] > 200_000_000
    order = [PHASES.index(report["loading"]["phase"]) for _, report in loading]
    # The weights' phase, the longest by far (a worker's start and 240 MB read), is always caught.
    assert order == sorted(order) and PHASES.index("reading weights") in order, order
    after = loopback.get(f"{fleet.v1}/models", timeout=10.0).json()["data"]
    assert all("loading" not in card for card in after if card["state"] == "ready")
