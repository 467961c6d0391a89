"""`/fit` names each form of the weights with its plan's window and speed, read from real servers.

The default server's tiny model is stored in float and is served as stored, whatever the setting; the
issue's Qwen3-0.6B shape (4-bit) under 12 GiB keeps its whole window on the CPU backend, where float32
weights would cut it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stages.kv.machine import backend
from tests import loopback
from tests.conftest import REPO, ServerFactory, _free_port

SCRIPT = Path(sys.executable).parent / "mlx-relay"


def weights_of(server_factory: ServerFactory, **settings: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The server's `/fit`, and its `weights` report."""
    fit: dict[str, Any] = loopback.get(f"{server_factory(**settings).base_url}/fit", timeout=30).json()
    return fit, fit["weights"]


def test_a_model_stored_in_float_has_one_form_and_no_options(server_factory: ServerFactory) -> None:
    _, weights = weights_of(server_factory)
    assert weights == {"served": "stored", "description": "as stored (not quantized)", "options": []}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(backend() != "cpu", reason="the choice under test is the CPU backend's")
def test_the_qwen3_shape_under_twelve_gib_keeps_its_window_and_fit_shows_each_form(
    server_factory: ServerFactory,
) -> None:
    from stages.models.shaped import ensure_shaped_model

    ensure_shaped_model("qwen3-0.6b")
    settings = {"model": "shaped:qwen3-0.6b", "memory_budget": str(12 << 30)}
    fit, weights = weights_of(server_factory, **settings)
    options = {option["form"]: option for option in weights["options"]}
    assert set(options) == {"float32", "bfloat16", "float16", "stored"}
    assert fit["memory"]["max_safe_context"] == fit["model"]["context_window"] == 40960
    assert weights["served"] in ("bfloat16", "stored") and options[weights["served"]]["admits_window"]
    assert options["float32"]["max_safe_context"] < 40960 and not options["float32"]["admits_window"]
    assert options["float32"]["kv_bytes_per_token"] == 2 * fit["memory"]["kv_bytes_per_token"]
    assert all(option["relative_decode_speed"] > 0 for option in options.values())
    assert options["stored"]["relative_decode_speed"] == options["stored"]["relative_prefill_speed"] == 1.0
    stats = loopback.get(f"{server_factory(**settings).base_url}/stats", timeout=30).json()
    assert stats["weights"] == weights["description"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--weights", "fast"], "argument --weights: invalid choice: 'fast'"),
        (["--weights", "float32", "--model", "tiny"], "MLX_RELAY_KEEP_QUANTIZED=1 (weights as stored) contradicts"),
    ],
    ids=["flag", "contradiction"],
)
def test_serve_refuses_a_bad_weights_choice_naming_it(args: list[str], named: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_")} | {"MLX_RELAY_KEEP_QUANTIZED": "1"}
    command = [str(SCRIPT), "serve", "--port", str(_free_port()), *args]
    refused = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert named in refused.stderr.splitlines()[-1]
