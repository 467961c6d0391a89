"""The machine a server plans for: RAM (the cgroup limit where lower), chip, memory bandwidth, backend."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import time
from pathlib import Path

import attrs

# Published memory bandwidth of Apple silicon, bytes/s: the decode bound.
_APPLE_BANDWIDTH = {
    "M1": 68e9,
    "M1 Pro": 200e9,
    "M1 Max": 400e9,
    "M1 Ultra": 800e9,
    "M2": 100e9,
    "M2 Pro": 200e9,
    "M2 Max": 400e9,
    "M2 Ultra": 800e9,
    "M3": 100e9,
    "M3 Pro": 150e9,
    "M3 Max": 400e9,
    "M3 Ultra": 819e9,
    "M4": 120e9,
    "M4 Pro": 273e9,
    "M4 Max": 546e9,
}
# 64 MiB: far past the CPU caches, and copied in ~20 ms.
_PROBE_BYTES = 64 << 20


@attrs.frozen(kw_only=True)
class Machine:
    ram_bytes: int
    chip: str | None
    cpus: int | None
    bandwidth_bytes_per_s: float
    # "published" (a known chip) or "memcpy" (measured on one thread: a lower bound).
    bandwidth_source: str
    # Where MLX runs the model: "metal", "cuda" or "cpu".
    backend: str = "cpu"


def read_machine() -> Machine:
    """This machine: its memory, chip and copy bandwidth (the chip's published figure, else measured once)."""
    chip = _chip()
    known = _APPLE_BANDWIDTH.get(chip.removeprefix("Apple ").strip()) if chip else None
    return Machine(
        ram_bytes=_ram_bytes(),
        chip=chip,
        cpus=os.cpu_count(),
        bandwidth_bytes_per_s=known or _measure_bandwidth(),
        bandwidth_source="published" if known else "memcpy",
        backend=backend(),
    )


def backend() -> str:
    """The device MLX computes on: `cpu`, `metal` or `cuda`."""
    import mlx.core as mx

    if mx.default_device() != mx.gpu:
        return "cpu"
    return "metal" if mx.metal.is_available() else "cuda"


def _ram_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # A container's memory limit is the real ceiling; "max" means none.
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            raw = limit.read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            total = min(total, int(raw))
    return int(total)


def _chip() -> str | None:
    if platform.system() == "Darwin":
        try:
            found = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return found.stdout.strip() or None
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or None


# Once a process: the front plans each model it serves (twice where the weights' form is chosen) and checks each pull's
# fit, and the probe is 0.11 s of CPU and 128 MiB touched each time for a figure that does not change while the process
# runs. A model worker plans nothing: it takes its front's plan (stages/remote/crossing.py's `StartIn`).
@functools.cache
def _measure_bandwidth() -> float:
    source, target = bytearray(_PROBE_BYTES), bytearray(_PROBE_BYTES)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        target[:] = source
        best = min(best, time.perf_counter() - start)
    # A copy reads and writes every byte.
    return 2 * _PROBE_BYTES / best
