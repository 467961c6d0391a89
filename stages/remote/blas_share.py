"""How many BLAS threads each model worker's matmuls use when several models share the machine's cores.

On the CPU backend MLX's matmuls run on the BLAS (stages/models/blas.py),
whose OpenMP team is as many threads as the machine has cores. One worker
alone may have them all. Several workers, each with a full team, ask for
several times the cores, and an OpenMP matmul waits at its barrier for the
slowest of its threads: a thread that another worker's team (or a loading
worker) has pushed off its core stalls the whole step. Measured with
`python -m bench.fleet` (4 streams on `demo` while SmolLM2 loads, 2 cores):
the streams' p95 gap rose +417% during the load with a full team per worker,
+49% with one thread each, and their gaps alone were the same either way
(24-25 ms p50). So a front that serves several models gives each worker an
equal share of the cores (at least one thread), unless the user set a thread
count in the environment, which every worker inherits as it is.
Linux only: elsewhere MLX computes on Metal or the GPU.
"""

from __future__ import annotations

import os
import sys

import attrs

# The variables the BLAS builds read: OpenMP's (MKL, OpenMP OpenBLAS), MKL's own, OpenBLAS's pthreads build.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@attrs.define
class BlasShare:
    # Models the front serves: their workers share the cores.
    models: int = 1

    def threads(self) -> int | None:
        """Each worker's BLAS threads; None: left to the environment or the BLAS's default."""
        if self.models < 2 or sys.platform != "linux" or any(name in os.environ for name in _THREAD_VARIABLES):
            return None
        return max(1, len(os.sched_getaffinity(0)) // self.models)

    def environment(self) -> dict[str, str]:
        """What a worker's environment adds: the thread count, in every variable a BLAS may read."""
        threads = self.threads()
        return {} if threads is None else dict.fromkeys(_THREAD_VARIABLES, str(threads))

    def describe(self) -> str:
        threads = self.threads()
        if threads is not None:
            return f"{threads} per worker ({len(os.sched_getaffinity(0))} cores shared by {self.models} models)"
        given = {name: os.environ[name] for name in _THREAD_VARIABLES if name in os.environ}
        if given:
            return "from the environment: " + ", ".join(f"{name}={value}" for name, value in given.items())
        return "the BLAS's default"


# One per process: the front's fleet sets `models` at start (fleet/fleet.py); every worker start reads it.
BLAS_SHARE = BlasShare()
