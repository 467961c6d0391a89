"""`mlx-relay pull`, `mlx-relay models` and `mlx-relay rm`: the Hugging Face cache from the command line.

`mlx_relay.py` adds these subcommands (`add_commands`) and runs the one chosen (`run`). `pull` prints the fit on
this machine, then a progress line on stderr (bytes, rate, time left: redrawn on a terminal, a line every few
seconds and at each file's end otherwise) and the snapshot's directory on stdout. A failure is one line on stderr
and exit status 2. The settings that size the plan (`MLX_RELAY_MEMORY_BUDGET` and the rest) are read from the
environment as `mlx-relay serve` reads them.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import TextIO

import attrs

from pipeline.settings import Settings
from stages.models.pull import Converting, Fitted, Listed, Progress, Pulled, PullError, PullEvent
from stages.models.pull_cache import cached_models, remove_model
from stages.models.pull_gguf import pull_model
from stages.models.sku import APPLE_MEMORY_GB, Planning, Verdict, describe, planning_of

USAGE_ERROR = 2
MODEL_COMMANDS = frozenset({"pull", "models", "rm"})
# Without a terminal, a progress line at most this often (and at each file's end).
_LINE_EVERY_S = 2.0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fetch = commands.add_parser(
        "pull",
        help="download a Hugging Face model into the Hugging Face cache, with progress",
        description="Download REPO[:REVISION] through huggingface_hub (HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN apply), "
        "after checking it fits this machine; each file is checked against the Hub's digest.",
    )
    fetch.add_argument("reference", metavar="REPO[:REVISION]", help="also REPO:FILE.gguf, or hf.co/REPO:QUANT")
    fetch.add_argument("--file", help="the GGUF file to take from a repository of several (it is then converted)")
    fetch.add_argument("--force", action="store_true", help="download even a model that does not fit this machine")
    listing = commands.add_parser("models", help="list the models in the Hugging Face cache: size and fit")
    listing.add_argument("--fit", action="store_true", help="whether each fits the common Apple machines (8-512 GB)")
    remove = commands.add_parser("rm", help="remove a model from the Hugging Face cache")
    remove.add_argument("repo", metavar="REPO")


def run(args: argparse.Namespace) -> int:
    """Run the chosen subcommand; its exit status (2 with one line on stderr for a failure a user can fix)."""
    try:
        if args.command == "pull":
            return _pull(args.reference, force=args.force, file=args.file)
        if args.command == "models":
            return _models(fit=args.fit)
        remove_model(args.repo)
        print(f"removed {args.repo}")
        return 0
    except PullError as error:
        print(f"mlx-relay: {error}", file=sys.stderr)
        return USAGE_ERROR


def planning() -> Planning:
    return planning_of(Settings.from_env())


def _pull(reference: str, *, force: bool, file: str | None) -> int:
    display = ProgressLine(sys.stderr)
    path = pull_model(reference, on_event=display.show, planning=planning(), force=force, file=file)
    print(path)
    return 0


@attrs.define
class ProgressLine:
    """The pull's events as text: the file list and fit once, then bytes, rate and time left."""

    out: TextIO
    started: float = attrs.field(factory=time.monotonic)
    last_line: float = 0.0
    current: str = ""

    def show(self, event: PullEvent) -> None:
        if isinstance(event, Listed):
            manifest = event.manifest
            count, size = len(manifest.files), _size(manifest.total_bytes)
            self._say(f"{manifest.repo} at {manifest.commit[:12]}: {count} files, {size}")
        elif isinstance(event, Fitted):
            self._say(f"this machine: {event.summary}")
        elif isinstance(event, Progress):
            self._progress(event)
        elif isinstance(event, Converting):
            self._end_line()
            self._say(f"converting {event.file.name} to an mlx-lm directory (once)")
        elif isinstance(event, Pulled):
            self._end_line()
            self._say(f"pulled and checked in {time.monotonic() - self.started:.1f} s")

    def _progress(self, event: Progress) -> None:
        line = progress_text(event, time.monotonic() - self.started)
        finished = event.completed >= event.file.size
        if self.out.isatty():
            width = shutil.get_terminal_size().columns - 1
            self.out.write("\r" + line[:width].ljust(width))
            self.out.flush()
        elif finished or time.monotonic() - self.last_line >= _LINE_EVERY_S:
            self._say(line)
            self.last_line = time.monotonic()

    def _end_line(self) -> None:
        if self.out.isatty():
            self.out.write("\n")

    def _say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def progress_text(event: Progress, elapsed: float) -> str:
    """`name  [#####     ]  45.2 MB / 98.4 MB  12.3 MB/s  0:04 left` for all files' bytes so far."""
    share = event.done_bytes / event.total_bytes if event.total_bytes else 1.0
    bar = "#" * round(share * 20)
    rate = event.done_bytes / elapsed if elapsed > 0 else 0.0
    left = (event.total_bytes - event.done_bytes) / rate if rate > 0 else 0.0
    minutes, seconds = divmod(int(left), 60)
    sizes = f"{_size(event.done_bytes)} / {_size(event.total_bytes)}"
    return f"{event.file.name}  [{bar:<20}]  {sizes}  {_size(int(rate))}/s  {minutes}:{seconds:02d} left"


def _models(*, fit: bool) -> int:
    models = cached_models(planning())
    if not models:
        print("no models in the Hugging Face cache")
        return 0
    width = max(len(model.repo) for model in models)
    for model in models:
        here = describe(model.here) if model.here else "unknown (no config.json)"
        print(f"{model.repo:<{width}}  {_size(model.size_bytes):>9}  {here}")
        if fit and model.matrix:
            for gb, verdict in zip(APPLE_MEMORY_GB, model.matrix, strict=True):
                print(f"    {gb:>4} GB  {_cell(verdict)}")
    return 0


def _cell(verdict: Verdict) -> str:
    if not verdict.fits:
        return "no"
    if verdict.streams:
        return f"yes  {verdict.streams} streams at {verdict.context_window} tokens, KV {verdict.kv_scheme}"
    return f"yes  at most {verdict.max_context} tokens, KV {verdict.kv_scheme}"


def _size(count: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
