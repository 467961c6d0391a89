"""The models in the Hugging Face cache: what is there, its size and fit, and removing one.

Reads `huggingface_hub`'s cache layout (`models--owner--name/` with `blobs/`, `snapshots/<commit>/`, `refs/`),
in the folder `HF_HUB_CACHE` names. A model's snapshot is the one `refs/main` names, else the newest; its fit is
`stages/models/sku.py`'s from the snapshot's config.json and weight files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs

from stages.kv.machine import read_machine
from stages.kv.shape import ModelShape
from stages.models.pull import WEIGHT_SUFFIXES, Hub, PullError, split_reference
from stages.models.sku import Planning, Verdict, model_shape, sku_matrix, verdict

_PREFIX = "models--"


@attrs.frozen(kw_only=True)
class CachedModel:
    repo: str
    size_bytes: int
    snapshot: Path | None
    # None where the snapshot has no config.json.
    here: Verdict | None
    matrix: tuple[Verdict, ...] = ()


def cached_models(planning: Planning, hub: Hub | None = None) -> list[CachedModel]:
    """Every model repository in the cache, by repo id."""
    cache = (hub or Hub()).cache()
    folders = sorted(cache.glob(_PREFIX + "*")) if cache.is_dir() else []
    machine = read_machine() if folders else None
    models = []
    for folder in folders:
        snapshot = _snapshot(folder)
        shape = _shape(snapshot) if snapshot else None
        here = verdict(shape, machine, planning) if shape and machine else None
        models.append(
            CachedModel(
                repo=folder.name.removeprefix(_PREFIX).replace("--", "/", 1),
                size_bytes=sum(blob.stat().st_size for blob in (folder / "blobs").glob("*") if blob.is_file()),
                snapshot=snapshot,
                here=here,
                matrix=tuple(sku_matrix(shape, planning)) if shape else (),
            )
        )
    return models


def model_folder(repo: str, hub: Hub | None = None) -> Path:
    """The cache folder of `repo` (owner/name), whether or not it exists."""
    repo_id, _ = split_reference(repo)
    return (hub or Hub()).storage(repo_id)


def remove_model(repo: str, hub: Hub | None = None) -> Path:
    """Remove `repo` from the cache, every revision; the folder removed.

    Raises:
        PullError: `not_found` where the cache holds no such repository.
    """
    folder = model_folder(repo, hub)
    if not folder.is_dir():
        raise PullError("not_found", f"{repo} is not in the Hugging Face cache ({folder.parent})")
    shutil.rmtree(folder)
    shutil.rmtree(folder.parent / ".locks" / folder.name, ignore_errors=True)
    return folder


def _snapshot(folder: Path) -> Path | None:
    ref = folder / "refs" / "main"
    if ref.is_file() and (folder / "snapshots" / ref.read_text().strip()).is_dir():
        return folder / "snapshots" / ref.read_text().strip()
    snapshots = [path for path in (folder / "snapshots").glob("*") if path.is_dir()]
    return max(snapshots, key=lambda path: path.stat().st_mtime) if snapshots else None


def _shape(snapshot: Path) -> ModelShape | None:
    config = snapshot / "config.json"
    if not config.is_file():
        return None
    weights = sum(path.stat().st_size for path in snapshot.iterdir() if path.name.endswith(WEIGHT_SUFFIXES))
    return model_shape(json.loads(config.read_text()), weights)
