"""Which file of a GGUF repository a pull takes, from how the model was named.

A GGUF repository (`.gguf` files and no safetensors) usually holds one file per quantization. The file is the
one named (`REPO:FILE.gguf`, or `--file`), else the repository's only one; with several and none named the pull
is refused, naming them. Ollama's form `hf.co/REPO[:QUANT]` picks as Ollama does: the file whose name carries
the tag as a quantization (case-insensitive, `Q4_K_M` matches `Llama-3.2-1B-Q4_K_M.gguf`), and with no tag (or
`latest`) Q4_K_M where the repository has it. Vision projectors (`mmproj*.gguf`) are never chosen unnamed.

A GGUF pull fetches only the chosen file and the repository's small metadata files (README, licence, JSON).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from stages.models.pull import Manifest, PullError, split_reference
from stages.models.pull_files import RemoteFile

HUB_PREFIXES = ("hf.co/", "huggingface.co/")
# Ollama's quantization when a tag names none.
OLLAMA_DEFAULT_QUANT = "Q4_K_M"
_METADATA_SUFFIXES = (".md", ".json", ".txt", ".jinja")
_METADATA_NAMES = ("LICENSE", "NOTICE", "USE_POLICY")
_METADATA_MAX_BYTES = 1 << 20
# llama.cpp's split files (`-00001-of-00003.gguf`) are parts of one model, which the converters cannot join.
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


@attrs.frozen(kw_only=True)
class Wanted:
    """A model reference read: the repository, its revision, and the GGUF file or Ollama tag it names."""

    repo: str
    revision: str = "main"
    file: str | None = None
    quant: str | None = None
    # Named as Ollama names a Hub model (`hf.co/...`): no tag means Ollama's default quantization.
    ollama: bool = False


def parse_reference(reference: str, file: str | None = None) -> Wanted:
    """`REPO[:REVISION]`, `REPO:FILE.gguf` or `hf.co/REPO[:QUANT]` (`file`, from `--file`, names the GGUF too).

    Raises:
        PullError: `not_found` for a name that is not `owner/name`, or two different files named.
    """
    ollama = reference.startswith(HUB_PREFIXES)
    for prefix in HUB_PREFIXES:
        reference = reference.removeprefix(prefix)
    repo, revision = split_reference(reference)
    tag = reference.partition(":")[2]
    named = tag if tag.endswith(".gguf") else None
    if named and file and named != file:
        raise PullError("not_found", f"{reference!r} and --file {file!r} name different files")
    if named or ollama:
        quant = tag if ollama and not named and tag.lower() not in ("", "latest") else None
        return Wanted(repo=repo, file=named or file, quant=quant, ollama=ollama)
    return Wanted(repo=repo, revision=revision, file=file)


def choose_gguf(manifest: Manifest, wanted: Wanted) -> RemoteFile | None:
    """The GGUF file to pull; None for a repository that is not a GGUF one (and names none).

    Raises:
        PullError: `not_found` (the named file or quantization is not there), `ambiguous` (several, none named)
            or `unsupported` (a split GGUF).
    """
    by_name = {file.name: file for file in manifest.files}
    name = choose_name(list(by_name), wanted)
    return None if name is None else by_name[name]


def choose_name(names: Sequence[str], wanted: Wanted) -> str | None:
    """`choose_gguf` over file names alone (a manifest's, or a snapshot's in the cache)."""
    ggufs = sorted(name for name in names if name.endswith(".gguf"))
    if wanted.file:
        return _named(ggufs, wanted)
    if not ggufs or any(name.endswith(".safetensors") for name in names):
        return None
    candidates = [name for name in ggufs if not name.rsplit("/", 1)[-1].lower().startswith("mmproj")]
    quant = wanted.quant or (OLLAMA_DEFAULT_QUANT if wanted.ollama and len(candidates) > 1 else None)
    if quant:
        candidates = [name for name in candidates if quant.lower() in _name_parts(name)]
        if not candidates:
            quants = ", ".join(sorted({quant_of(name) or name for name in ggufs}))
            raise PullError("not_found", f"{wanted.repo} has no {quant} GGUF file; it has {quants}")
    if len(candidates) != 1:
        listed = ", ".join(candidates or ggufs)
        raise PullError(
            "ambiguous",
            f"{wanted.repo} has {len(candidates or ggufs)} GGUF files; name one with "
            f"{wanted.repo}:FILE.gguf (or --file FILE.gguf): {listed}",
        )
    return _unsplit(candidates[0], wanted)


def _named(ggufs: Sequence[str], wanted: Wanted) -> str:
    for name in ggufs:
        if wanted.file in (name, name.rsplit("/", 1)[-1]):
            return _unsplit(name, wanted)
    raise PullError("not_found", f"{wanted.repo} has no file {wanted.file}; its GGUF files: {', '.join(ggufs)}")


def _unsplit(name: str, wanted: Wanted) -> str:
    if _SPLIT.search(name):
        raise PullError("unsupported", f"{wanted.repo}: {name} is one part of a split GGUF, which is not converted")
    return name


def _name_parts(name: str) -> list[str]:
    """A file name's dash- and dot-separated parts, lower case: where a quantization is named."""
    return [part.lower() for part in re.split(r"[-.]", name.rsplit("/", 1)[-1].removesuffix(".gguf"))]


def quant_of(name: str) -> str | None:
    """The quantization a GGUF file name carries (`Q4_K_M`, `Q8_0`, `F16`, `IQ4_XS`), or None."""
    for part in reversed(_name_parts(name)):
        if re.fullmatch(r"(i?q\d+(_[a-z0-9]+)*|f16|f32|bf16)", part):
            return part.upper()
    return None


def gguf_manifest(manifest: Manifest, chosen: RemoteFile) -> Manifest:
    """The manifest cut to the chosen file and the small metadata files beside it."""

    def kept(file: RemoteFile) -> bool:
        small = file.size <= _METADATA_MAX_BYTES and "/" not in file.name
        return small and (file.name.endswith(_METADATA_SUFFIXES) or file.name.upper().startswith(_METADATA_NAMES))

    files = tuple(file for file in manifest.files if file == chosen or kept(file))
    return attrs.evolve(manifest, files=files)
