"""stages/models/blas.py: the BLAS preloaded before mlx, and the name /stats reports for it.

Each case runs in a fresh interpreter: the BLAS is bound when mlx is first
imported, once per process.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from tests.conftest import REPO

_PROBE = """
import stages.models.blas as blas
{patch}
print(blas.preload_blas())
import mlx.core as mx
a = mx.ones((64, 64))
print(float((a @ a)[0, 0]))
print(any("{library}" in line for line in open("/proc/self/maps")))
"""


def probe(patch: str, library: str) -> list[str]:
    code = _PROBE.format(patch=patch, library=library)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def mkl_installed() -> bool:
    try:
        metadata.version("mkl")
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(sys.platform != "linux", reason="the preload is for Linux CPUs")
@pytest.mark.skipif(not mkl_installed(), reason="the mkl wheel (the cpu extra, x86_64 Linux) is not installed")
def test_without_openblas_the_mkl_wheel_is_loaded_and_named() -> None:
    name, product, mapped = probe("blas._OPENBLAS = ()", "libmkl_rt")
    assert name.startswith("mkl (Intel(R) oneAPI Math Kernel Library") and "from the mkl wheel" in name
    assert product == "64.0"
    assert mapped == "True"


@pytest.mark.skipif(sys.platform != "linux", reason="the preload is for Linux CPUs")
def test_with_neither_the_reference_blas_is_named() -> None:
    name, product, mapped = probe("blas._OPENBLAS = (); blas._mkl_rt = lambda: None", "libmkl_rt")
    assert name.startswith("reference")
    assert product == "64.0"
    assert mapped == "False"
