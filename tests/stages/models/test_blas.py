"""stages/models/blas.py: the BLAS preloaded before mlx, and the name /stats reports for it.

Each case runs in a fresh interpreter: the BLAS is bound when mlx is first
imported, once per process.
"""

from __future__ import annotations

import os
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


_THREADS_PROBE = """
import ctypes, os
import stages.models.blas as blas
blas._OPENBLAS = ()
print(blas.preload_blas())
mkl = next(ctypes.CDLL(line.split()[-1]) for line in open("/proc/self/maps") if "libmkl_rt" in line)
print(mkl.MKL_Get_Max_Threads())
# A fork's environment names the worker's share only after the BLAS has loaded (stages/remote/zygote.py).
os.environ["MKL_NUM_THREADS"] = "1"
blas.follow_thread_environment()
print(mkl.MKL_Get_Max_Threads())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the preload is for Linux CPUs")
@pytest.mark.skipif(not mkl_installed(), reason="the mkl wheel (the cpu extra, x86_64 Linux) is not installed")
def test_a_thread_count_named_after_the_blas_loaded_reaches_it() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    environment["MKL_NUM_THREADS"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", _THREADS_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.returncode == 0, done.stderr
    name, before, after = done.stdout.splitlines()
    assert name.startswith("mkl") and (before, after) == ("2", "1")


def test_the_environments_thread_count_is_read_as_the_blas_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """What cpu_attention sizes its pool by: the preloaded BLAS's own variable before OpenMP's, and None unset."""
    from stages.models import blas

    for name in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(blas, "_thread_setter", (lambda threads: None, ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")))
    assert blas.environment_threads() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    assert blas.environment_threads() == 4
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert blas.environment_threads() == 2
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "0")
    assert blas.environment_threads() == 4
