"""Pulling a model from the Hugging Face Hub into its ordinary cache, before any request needs it.

Takes `REPO[:REVISION]`; gives the snapshot directory in the Hugging Face cache (`huggingface_hub`'s layout, so
mlx-lm and every other tool finds it) and, on the way, events for a progress display: the file list, the fit on
this machine, bytes as they arrive, each file's check. Downloads go through `huggingface_hub` (`hf_hub_download`
with a tqdm class of ours, its resume after a cut connection, its size check); each file is then checked against
the digest the Hub lists (LFS files' sha256, other files' git blob id). A model that does not fit is refused
after reading its config.json and before any other byte. A failed pull leaves nothing of itself: files, snapshot
and ref it added are removed, and the revision's ref is written last, once every file is checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs

from stages.models.pull_files import FileBar, RemoteFile, bar_class, file_ok
from stages.models.sku import Planning, Verdict, describe, model_shape, verdict

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz")


class PullError(Exception):
    """A pull that failed, told in one line; `kind` is not_found, too_big, checksum, network, or for a GGUF
    repository ambiguous (several files, none named) or unsupported (an architecture or type not converted)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@attrs.frozen(kw_only=True)
class Manifest:
    repo: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(file.size for file in self.files)

    @property
    def weights_bytes(self) -> int:
        return sum(file.size for file in self.files if file.name.endswith(WEIGHT_SUFFIXES))


@attrs.frozen(kw_only=True)
class Listed:
    manifest: Manifest


@attrs.frozen(kw_only=True)
class Fitted:
    """This machine's verdict; None for a repository with no config.json (a GGUF repository)."""

    verdict: Verdict | None
    summary: str


@attrs.frozen(kw_only=True)
class Progress:
    file: RemoteFile
    completed: int
    # All files' bytes so far, of the manifest's total.
    done_bytes: int
    total_bytes: int


@attrs.frozen(kw_only=True)
class Verifying:
    file: RemoteFile


@attrs.frozen(kw_only=True)
class Converting:
    """A GGUF file, pulled and checked, being converted into an mlx-lm directory (stages/models/pull_gguf.py)."""

    file: RemoteFile


@attrs.frozen(kw_only=True)
class Pulled:
    """The end of a pull: the snapshot, or a GGUF repository's converted directory."""

    path: Path
    manifest: Manifest


PullEvent = Listed | Fitted | Progress | Verifying | Converting | Pulled


def split_reference(reference: str) -> tuple[str, str]:
    """`REPO[:REVISION]` into the repo id and the revision (`main` when none)."""
    repo, _, revision = reference.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise PullError("not_found", f"{reference!r} is not a Hugging Face repo id (owner/name[:revision])")
    return repo, revision or "main"


@attrs.frozen(kw_only=True)
class Hub:
    """Where to pull from and into: None means `huggingface_hub`'s own (`HF_ENDPOINT`, `HF_HUB_CACHE`)."""

    endpoint: str | None = None
    cache_dir: Path | None = None
    token: str | None = None

    def cache(self) -> Path:
        from huggingface_hub import constants

        return self.cache_dir or Path(constants.HF_HUB_CACHE)

    def storage(self, repo: str) -> Path:
        """Model repository `repo`'s folder in the cache, named as `huggingface_hub` names it."""
        from huggingface_hub.file_download import repo_folder_name

        return self.cache() / repo_folder_name(repo_id=repo, repo_type="model")


def read_manifest(repo: str, revision: str, hub: Hub) -> Manifest:
    """The revision's commit and files with their sizes and digests.

    Raises:
        PullError: `not_found` for an unknown repository or revision, `network` when the Hub cannot be reached.
    """
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=hub.endpoint, token=hub.token).model_info(repo, revision=revision, files_metadata=True)
    except Exception as error:  # noqa: BLE001 - huggingface_hub's errors and httpx's, told in one line
        raise _pull_error(error, repo, revision) from None
    files = tuple(
        RemoteFile(name=s.rfilename, size=s.size or 0, sha256=s.lfs.sha256 if s.lfs else None, blob_id=s.blob_id)
        for s in info.siblings or []
    )
    return Manifest(repo=repo, revision=revision, commit=str(info.sha), files=files)


def _pull_error(error: Exception, repo: str, revision: str) -> PullError:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(error, RevisionNotFoundError):
        return PullError("not_found", f"{repo} has no revision {revision!r}")
    if isinstance(error, (RepositoryNotFoundError, GatedRepoError)):
        return PullError("not_found", f"repository {repo} not found (or it is private or gated: set HF_TOKEN)")
    return PullError("network", f"could not read {repo} from the Hub: {type(error).__name__}: {error}")


def check_fit(manifest: Manifest, hub: Hub, planning: Planning) -> Fitted:
    """This machine's verdict from the repository's config.json, fetched into a scratch folder, not the cache."""
    if not any(file.name == "config.json" for file in manifest.files):
        return Fitted(verdict=None, summary="no config.json (a GGUF repository?): fit is known once converted")
    from stages.kv.machine import read_machine

    config = _remote_config(manifest, hub)
    answer = verdict(model_shape(config, manifest.weights_bytes), read_machine(), planning)
    return Fitted(verdict=answer, summary=describe(answer))


def _remote_config(manifest: Manifest, hub: Hub) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download

    with tempfile.TemporaryDirectory(prefix="mlx-relay-config-") as scratch:
        path = hf_hub_download(
            manifest.repo,
            "config.json",
            revision=manifest.commit,
            cache_dir=scratch,
            endpoint=hub.endpoint,
            token=hub.token,
        )
        return cast(dict[str, Any], json.loads(Path(path).read_text()))


def fetch_manifest(
    manifest: Manifest, fitted: Fitted, hub: Hub, on_event: Callable[[PullEvent], None], *, force: bool
) -> Path:
    """The manifest's files into the cache, each checked, its ref written last; the snapshot directory.

    Raises:
        PullError: `too_big` where `fitted` says it does not fit (unless `force`), `checksum` or `network`.
    """
    if fitted.verdict is not None and not fitted.verdict.fits and not force:
        raise PullError("too_big", f"{manifest.repo} {fitted.summary}; nothing was downloaded")
    undo = _Undo.before(hub, manifest)
    try:
        _fetch_all(manifest, hub, on_event)
    except BaseException:
        undo.run()
        raise
    _write_ref(undo.storage, manifest.revision, manifest.commit)
    return undo.storage / "snapshots" / manifest.commit


def _fetch_all(manifest: Manifest, hub: Hub, on_event: Callable[[PullEvent], None]) -> None:
    done = 0
    for file in manifest.files:
        start = done

        def moved(completed: int, file: RemoteFile = file, start: int = start) -> None:
            on_event(
                Progress(file=file, completed=completed, done_bytes=start + completed, total_bytes=manifest.total_bytes)
            )

        path = _fetch(manifest, file, hub, bar_class(moved))
        # A file already in the cache reports no bytes; every file ends with its whole size.
        moved(file.size)
        on_event(Verifying(file=file))
        if not file_ok(file, Path(path)):
            raise PullError(
                "checksum",
                f"{manifest.repo}: {file.name} does not match the Hub's digest ({file.digest}); "
                "the download was removed, pull again",
            )
        done += file.size


def _fetch(manifest: Manifest, file: RemoteFile, hub: Hub, bar: type[FileBar]) -> str:
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(
            manifest.repo,
            file.name,
            revision=manifest.commit,
            cache_dir=hub.cache_dir,
            endpoint=hub.endpoint,
            token=hub.token,
            tqdm_class=bar,
        )
    except OSError as error:
        raise PullError("network", f"{manifest.repo}: {file.name} could not be downloaded: {error}") from None


@attrs.frozen(kw_only=True)
class _Undo:
    """What the cache held of this repository before the pull, so a failed pull can leave it as it was."""

    storage: Path
    commit: str
    existed: bool
    snapshot_existed: bool
    blobs: frozenset[str]

    @classmethod
    def before(cls, hub: Hub, manifest: Manifest) -> _Undo:
        storage = hub.storage(manifest.repo)
        blobs = storage / "blobs"
        return cls(
            storage=storage,
            commit=manifest.commit,
            existed=storage.exists(),
            snapshot_existed=(storage / "snapshots" / manifest.commit).exists(),
            blobs=frozenset(os.listdir(blobs)) if blobs.is_dir() else frozenset(),
        )

    def run(self) -> None:
        if not self.existed:
            shutil.rmtree(self.storage, ignore_errors=True)
            return
        if not self.snapshot_existed:
            shutil.rmtree(self.storage / "snapshots" / self.commit, ignore_errors=True)
        blobs = self.storage / "blobs"
        added = set(os.listdir(blobs)) - self.blobs if blobs.is_dir() else set()
        for name in added:
            (blobs / name).unlink(missing_ok=True)


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """`refs/<revision>`, as huggingface_hub writes it: the mark that the revision is in the cache."""
    if revision == commit:
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    partial = ref.with_name(f".{ref.name}.{hashlib.sha1(commit.encode()).hexdigest()[:8]}")
    partial.write_text(commit)
    os.replace(partial, ref)
