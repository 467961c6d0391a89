"""Pulling any model reference, a GGUF repository's converted once into an mlx-lm directory.

`pull_model` is what `mlx-relay pull` and the pull routes run. A repository of safetensors is pulled as
`stages/models/pull.py` pulls it. A GGUF repository (`stages/models/gguf_pick.py` picks its file) is pulled as
the chosen file and its small metadata files; its fit is planned from the file's header, read with a `Range`
request before the download (`stages/models/gguf_header.py`), or from the file itself when a pull before fetched
it; then the file is converted, as the default model is (`stages/models/publish.py`'s `build_once`), into
`<cache root>/gguf/<owner>--<name>/<commit>/<file stem>-<CONVERTER_VERSION>/`. A second pull fetches nothing and
converts nothing.

`converted_gguf` is `resolve_model`'s way in: a repository id whose GGUF is in the Hugging Face cache gives the
converted directory (converting it first if a pull did not), reading nothing from the network.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stages.models.gguf_header import gguf_config, gguf_fit, local_header, remote_header
from stages.models.gguf_pick import Wanted, choose_gguf, choose_name, gguf_manifest, parse_reference
from stages.models.publish import build_once, default_cache_root
from stages.models.pull import (
    Converting,
    Hub,
    Listed,
    Pulled,
    PullError,
    PullEvent,
    check_fit,
    fetch_manifest,
    read_manifest,
)
from stages.models.sku import Planning

# Part of the converted directory's name: bump it whenever gguf.py's or gguf_gemma3.py's output changes.
CONVERTER_VERSION = "v1"


def pull_model(
    reference: str,
    *,
    on_event: Callable[[PullEvent], None],
    hub: Hub | None = None,
    planning: Planning | None = None,
    force: bool = False,
    file: str | None = None,
    cache_root: Path | None = None,
) -> Path:
    """Pull `REPO[:REVISION]`, `REPO:FILE.gguf` or `hf.co/REPO[:QUANT]`; blocking. Gives the snapshot, or for a
    GGUF repository the converted mlx-lm directory (`Pulled.path` too).

    Raises:
        PullError: `not_found`; `too_big` (refused before any weight is fetched, unless `force`); `checksum` (a file
            is not what the Hub lists; nothing of the pull is left); `network`; and `ambiguous` or `unsupported` for
            a GGUF repository (before any weight byte, but for a feature only its converter refuses: then the
            download stays, nothing of the conversion).
    """
    hub = hub or Hub()
    wanted = parse_reference(reference, file)
    manifest = read_manifest(wanted.repo, wanted.revision, hub)
    chosen = choose_gguf(manifest, wanted)
    if chosen is None:
        on_event(Listed(manifest=manifest))
        fitted = check_fit(manifest, hub, planning or Planning())
        on_event(fitted)
        snapshot = fetch_manifest(manifest, fitted, hub, on_event, force=force)
        on_event(Pulled(path=snapshot, manifest=manifest))
        return snapshot
    manifest = gguf_manifest(manifest, chosen)
    on_event(Listed(manifest=manifest))
    pulled = _snapshot(hub, wanted.repo, manifest.commit) / chosen.name
    header = local_header(pulled) if pulled.is_file() else remote_header(manifest, chosen, hub)
    fitted = gguf_fit(header, chosen, planning or Planning())
    on_event(fitted)
    snapshot = fetch_manifest(manifest, fitted, hub, on_event, force=force)
    target = converted_path(wanted.repo, manifest.commit, chosen.name, cache_root)
    if not target.is_dir():
        on_event(Converting(file=chosen))
        build_once(target, lambda dest: convert_gguf_file(snapshot / chosen.name, dest, cache_root))
    on_event(Pulled(path=target, manifest=manifest))
    return target


def converted_path(repo: str, commit: str, name: str, cache_root: Path | None = None) -> Path:
    """Where GGUF file `name` of `repo` at `commit` is kept converted, keyed by all three and the converter."""
    root = cache_root if cache_root is not None else default_cache_root()
    stem = name.rsplit("/", 1)[-1].removesuffix(".gguf")
    return root / "gguf" / repo.replace("/", "--") / commit / f"{stem}-{CONVERTER_VERSION}"


def convert_gguf_file(source: Path, dest: Path, cache_root: Path | None = None) -> None:
    """Write the mlx-lm directory for a llama or gemma3 GGUF file into `dest`.

    Raises:
        PullError: `unsupported`, an architecture, tensor type or feature its converter does not convert.
    """
    from stages.models.gguf import GGUFError

    header = local_header(source)
    gguf_config(header, source.name)
    try:
        if header.metadata["general.architecture"] == "llama":
            from stages.models.gguf import convert_gguf

            convert_gguf(source, dest)
        else:
            _convert_gemma3(source, dest, header.metadata.get("tokenizer.chat_template"), cache_root)
    except GGUFError as error:
        raise PullError("unsupported", f"{source.name}: {error}") from None


def _convert_gemma3(source: Path, dest: Path, template: object, cache_root: Path | None) -> None:
    from stages.models.gemma3_wheels import gemma3_chat_template
    from stages.models.gguf_gemma3 import convert_gemma3_gguf

    # A base model's GGUF carries no template: Gemma 3's published one, as the gemma3 built-in gets.
    root = cache_root if cache_root is not None else default_cache_root()
    convert_gemma3_gguf(source, dest, template if isinstance(template, str) else gemma3_chat_template(root))


def converted_gguf(model: str, *, hub: Hub | None = None, cache_root: Path | None = None) -> Path | None:
    """The converted directory of GGUF repository `model` (`REPO[:REVISION]`, `REPO:FILE.gguf`) as pulled into
    the Hugging Face cache, converted now if it is not yet; None where the cache holds no GGUF of it. Offline.

    Raises:
        PullError: `ambiguous`, several of its GGUF files pulled and none named; `unsupported`, as `pull_model`.
    """
    if Path(model).expanduser().exists():
        return None
    try:
        wanted = parse_reference(model)
    except PullError:
        return None
    snapshot = _cached_snapshot(hub or Hub(), wanted)
    if snapshot is None:
        return None
    name = choose_name([path.name for path in snapshot.iterdir()], wanted)
    if name is None:
        return None
    target = converted_path(wanted.repo, snapshot.name, name, cache_root)
    return build_once(target, lambda dest: convert_gguf_file(snapshot / name, dest, cache_root))


def _snapshot(hub: Hub, repo: str, commit: str) -> Path:
    return hub.storage(repo) / "snapshots" / commit


def _cached_snapshot(hub: Hub, wanted: Wanted) -> Path | None:
    """The snapshot `refs/<revision>` names (or the revision as a commit), where the cache has it."""
    ref = hub.storage(wanted.repo) / "refs" / wanted.revision
    commit = ref.read_text().strip() if ref.is_file() else wanted.revision
    snapshot = _snapshot(hub, wanted.repo, commit)
    return snapshot if snapshot.is_dir() else None
