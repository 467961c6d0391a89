"""Choose the BLAS that MLX's CPU backend calls, before `mlx` is imported.

The Linux `mlx[cpu]` wheel links the reference BLAS. Loading another BLAS with RTLD_GLOBAL first
interposes its `cblas_*` symbols: the system's OpenBLAS, which made a 1024x1024 float32 matmul about
35x faster on our build machines (DESIGN.md, "Speed on Linux CPUs"), else, where installing a system
package is not an option (no root), Intel MKL's `libmkl_rt` from the `mkl` wheel (the `cpu` extra
brings it on x86_64 Linux). OpenBLAS comes first: on the AMD EPYC build machines MKL ran the same
matmul at about half its speed. On macOS and CUDA builds this is a no-op: MLX computes on Metal or
the GPU there.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

# Debian's libopenblas0-pthread registers libopenblas.so.0 through
# alternatives; the explicit paths cover machines without the alternative.
_OPENBLAS = (
    "libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
)

_active: str | None = None
# The preloaded BLAS's function that sets its thread count, and the variables the BLAS reads that count from as it
# loads, the most specific first (`follow_thread_environment`).
_thread_setter: tuple[Callable[[int], None], tuple[str, ...]] | None = None
# Where no BLAS was preloaded (macOS, CUDA builds, the reference BLAS): any BLAS's variable.
_THREAD_VARIABLES = ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def preload_blas() -> str:
    """Load OpenBLAS globally if possible; return a description of the BLAS in use.

    Idempotent. Calling it after `mlx` was imported cannot change the BLAS,
    and the description says so.
    """
    global _active
    if _active is None:
        _active = _choose()
    return _active


def _choose() -> str:
    if sys.platform != "linux":
        return "platform (Accelerate / Metal)"
    if "mlx.core" in sys.modules:
        return "unknown (mlx was imported before the BLAS preload)"
    for name in _OPENBLAS:
        try:
            library = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        _keep_setter(library, "openblas_set_num_threads", ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"))
        return f"openblas ({_openblas_config(library)})"
    if (mkl := _mkl_rt()) is not None:
        try:
            library = ctypes.CDLL(str(mkl), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass
        else:
            _keep_setter(library, "MKL_Set_Num_Threads", ("MKL_NUM_THREADS", "OMP_NUM_THREADS"))
            return f"mkl ({_mkl_version(library)}, {mkl.name} from the mkl wheel)"
    return "reference (the BLAS bundled with mlx; install libopenblas0-pthread for ~35x faster matmuls)"


def follow_thread_environment() -> None:
    """Gives the preloaded BLAS the thread count this process's environment names now.

    A BLAS reads it once, as it loads. A model worker forked from a copy of the front
    (stages/remote/zygote.py) has the front's BLAS loaded already, with the front's count, and its
    environment was given the worker's share of the cores after the fork (stages/remote/blas_share.py).
    In a spawned worker this sets what the BLAS read anyway. The reference BLAS has no threads.
    """
    if _thread_setter is not None and (threads := environment_threads()) is not None:
        _thread_setter[0](threads)


def environment_threads() -> int | None:
    """The BLAS thread count this process's environment names, read as the preloaded BLAS reads it (its own
    variable first, then OpenMP's); None where none is set."""
    variables = _thread_setter[1] if _thread_setter is not None else _THREAD_VARIABLES
    for name in variables:
        if (value := os.environ.get(name, "")).isdigit() and int(value) > 0:
            return int(value)
    return None


def _keep_setter(library: ctypes.CDLL, name: str, variables: tuple[str, ...]) -> None:
    global _thread_setter
    try:
        setter = getattr(library, name)
    except AttributeError:
        return
    setter.argtypes = [ctypes.c_int]
    setter.restype = None
    _thread_setter = (setter, variables)


def _openblas_config(library: ctypes.CDLL) -> str:
    try:
        config = library.openblas_get_config
    except AttributeError:
        return "unknown version"
    config.restype = ctypes.c_char_p
    raw: bytes | None = config()
    return raw.decode().strip() if raw else "unknown version"


def _mkl_rt() -> Path | None:
    """The `mkl` wheel's single dynamic library, if that wheel is installed."""
    try:
        files = metadata.files("mkl") or []
    except metadata.PackageNotFoundError:
        return None
    found = sorted(Path(str(f.locate())) for f in files if f.name.startswith("libmkl_rt.so"))
    return next((path for path in found if path.exists()), None)


def _mkl_version(library: ctypes.CDLL) -> str:
    try:
        get_version = library.MKL_Get_Version_String
    except AttributeError:
        return "unknown version"
    buffer = ctypes.create_string_buffer(256)
    get_version(buffer, len(buffer))
    return buffer.value.decode(errors="replace").strip() or "unknown version"
