"""How far a model's load has got in this process: its phase, and since when, by the name it is served under.

Loading a model is a few steps of very different lengths, and `/v1/models` and `/health` say which one
a loading model is in rather than only "loading" (fleet/model_host.py reads it). The steps record themselves
here from the functions that do them (`stages/models/loading.py`), on whatever thread runs them; until
the first of them, a load is `starting` (placed, its engine being made):

- `fetching`: a Hugging Face repository's files found in its cache, or downloaded there where missing;
- `converting`: a built-in or shaped model found in its cache, or built there once (SmolLM2 and Gemma 3
  from their GGUF files, the random-weight models from their configs);
- `reading tokenizer`: the tokenizer and chat template read;
- `reading weights`: the rest, until the model takes requests: the memory plan, and the weights read
  onto the model thread, in a model worker's process where the model runs in one (its start included).

A phase is not a fraction: MLX reads a model's weights in one evaluation, with no count of the bytes it
has read to report, so the report gives the bytes it has to read (`weights_bytes`, the weight files'
sizes) beside the seconds spent so far.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import attrs

STARTING = "starting"
FETCHING = "fetching"
CONVERTING = "converting"
READING_TOKENIZER = "reading tokenizer"
READING_WEIGHTS = "reading weights"
PHASES = (STARTING, FETCHING, CONVERTING, READING_TOKENIZER, READING_WEIGHTS)
# The suffixes of the files a model's weights are read from.
_WEIGHT_FILES = ("*.safetensors", "*.gguf", "*.npz")


@attrs.frozen
class LoadPhase:
    phase: str
    # time.monotonic() when the phase began.
    since: float
    weights_bytes: int | None = None

    def report(self, *, loading_since: float) -> dict[str, str | float | int]:
        """The phase as `/v1/models` and `/health` show it: `phase`, `phase_s`, `elapsed_s`, `weights_bytes`."""
        now = time.monotonic()
        shown: dict[str, str | float | int] = {
            "phase": self.phase,
            "phase_s": round(now - self.since, 3),
            "elapsed_s": round(now - loading_since, 3),
        }
        if self.weights_bytes is not None:
            shown["weights_bytes"] = self.weights_bytes
        return shown


_lock = threading.Lock()
_phases: dict[str, LoadPhase] = {}


def record(name: str, phase: str, *, weights_from: Path | None = None) -> None:
    """Model `name` is now in `phase`; `weights_from`: the directory whose weight files it reads."""
    weights = weight_bytes(weights_from) if weights_from is not None else None
    with _lock:
        _phases[name] = LoadPhase(phase, time.monotonic(), weights)


def current(name: str) -> LoadPhase | None:
    with _lock:
        return _phases.get(name)


def forget(name: str) -> None:
    """The load of `name` settled (or starts again): no phase until its steps record one."""
    with _lock:
        _phases.pop(name, None)


def weight_bytes(path: Path) -> int:
    """The size of the weight files in model directory `path` (0 where it holds none)."""
    return sum(file.stat().st_size for pattern in _WEIGHT_FILES for file in path.glob(pattern) if file.is_file())
