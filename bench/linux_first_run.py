"""The default SmolLM2 on a Linux CPU: prefill and decode tokens/s, by BLAS and by weight form, in one run.

    python -m bench.linux_first_run [--prompt 256] [--decode 32] [--rounds 3] [--mkl SITE]

MLX's CPU backend takes its BLAS when `mlx` is first imported, so each case
runs in a fresh subprocess that loads its BLAS first: the reference BLAS the
`mlx[cpu]` wheel links, then MKL from the `mkl` wheel (installed, or in the
site-packages folder `--mkl` names) and the system's OpenBLAS where present.
Each BLAS serves the model as stored (4-bit) and dequantized to float32 (as
the server does on the CPU backend: stages/models/weights.py). Prefill is
one forward pass over `--prompt` random tokens into a fresh cache; decode is
`--decode` one-token steps after it. The best of `--rounds` per case; the
cases run in turns so a busy machine slows each alike. Figures are ratios to
the q4 reference-BLAS case of the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from stages.models.blas import _OPENBLAS

# Runs in the subprocess: load the BLAS, then mlx, then the model; print one JSON line.
_CASE = """
import ctypes, json, sys, time
library, float32, prompt, decode = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4])
if library:
    ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
import attrs
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from stages.models.loading import load_weights, resolve_model

model = load_weights(attrs.evolve(resolve_model("smollm2"), float32_weights=float32))
tokens = mx.random.randint(0, 49152, (1, prompt), key=mx.random.key(0))
mx.eval(model(tokens[:, :16], cache=make_prompt_cache(model)))  # warm-up
cache = make_prompt_cache(model)
start = time.perf_counter()
logits = model(tokens, cache=cache)
mx.eval(logits)
prefill = prompt / (time.perf_counter() - start)
token = mx.argmax(logits[:, -1:], axis=-1)
start = time.perf_counter()
for _ in range(decode):
    token = mx.argmax(model(token, cache=cache)[:, -1:], axis=-1)
    mx.eval(token)
print(json.dumps({"prefill": prefill, "decode": decode / (time.perf_counter() - start)}))
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.linux_first_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mkl", type=Path, default=None, help="a site-packages folder holding the mkl wheel")
    args = parser.parse_args(argv)
    blases = {"reference": ""} | _fast_blases(args.mkl)
    cases = [(blas, form) for blas in blases for form in ("q4", "float32")]
    best: dict[tuple[str, str], dict[str, float]] = {}
    for _ in range(args.rounds):
        for blas, form in cases:
            figures = _run(blases[blas], form == "float32", args.prompt, args.decode)
            kept = best.setdefault((blas, form), figures)
            best[(blas, form)] = {key: max(kept[key], figures[key]) for key in figures}
    base = best[("reference", "q4")]
    print(f"SmolLM2-135M, {args.prompt}-token prompt, {args.decode} decode steps, best of {args.rounds}")
    print(f"{'BLAS':<10} {'weights':<8} {'prefill tok/s':>14} {'x':>6} {'decode tok/s':>13} {'x':>6}")
    for (blas, form), figures in best.items():
        prefill, decode = figures["prefill"], figures["decode"]
        print(
            f"{blas:<10} {form:<8} {prefill:>14.1f} {prefill / base['prefill']:>6.1f} "
            f"{decode:>13.1f} {decode / base['decode']:>6.2f}"
        )


def _fast_blases(mkl_site: Path | None) -> dict[str, str]:
    found: dict[str, str] = {}
    openblas = next((path for path in _OPENBLAS[1:] if Path(path).exists()), None)
    if openblas is not None:
        found["openblas"] = openblas
    distributions = metadata.distributions(path=[str(mkl_site)]) if mkl_site else metadata.distributions()
    for distribution in distributions:
        if distribution.metadata["Name"] == "mkl":
            libraries = [Path(str(f.locate())) for f in distribution.files or [] if f.name.startswith("libmkl_rt.so")]
            existing = [str(path) for path in libraries if path.exists()]
            if existing:
                found["mkl"] = existing[-1]
    return found


def _run(library: str, float32: bool, prompt: int, decode: int) -> dict[str, float]:
    command = [sys.executable, "-c", _CASE, library, "1" if float32 else "0", str(prompt), str(decode)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


if __name__ == "__main__":
    main()
