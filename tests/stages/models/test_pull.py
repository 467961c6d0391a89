"""`stages/models/pull.py` against the loopback Hub (tests/hub.py): real HTTP, real files, huggingface_hub's client."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from stages.models.pull import Fitted, Hub, Listed, Progress, Pulled, PullError, PullEvent
from stages.models.pull_cache import cached_models, remove_model
from stages.models.pull_gguf import pull_model
from stages.models.sku import Planning
from tests.hub import Hub as LoopbackHub
from tests.hub import served_files

# A shape no machine here holds: 1 TB of weights (a sparse file, never read) for a 405B-style config.
_HUGE_CONFIG = {
    "num_hidden_layers": 126,
    "num_attention_heads": 128,
    "num_key_value_heads": 8,
    "hidden_size": 16384,
    "intermediate_size": 53248,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def hub(tiny_model: Path, tmp_path: Path) -> Iterator[LoopbackHub]:
    served = LoopbackHub()
    served.add("test/tiny", tiny_model)
    huge = tmp_path / "huge"
    huge.mkdir()
    (huge / "config.json").write_text(json.dumps(_HUGE_CONFIG))
    with (huge / "model.safetensors").open("wb") as weights:
        weights.truncate(10**12)
    served.add("test/huge", huge, declared_sha256={"model.safetensors": "0" * 64})
    with served.running() as running:
        yield running


def _pull(hub: LoopbackHub, cache: Path, reference: str, events: list[PullEvent] | None = None) -> Path:
    sink = events if events is not None else []
    return pull_model(reference, on_event=sink.append, hub=Hub(endpoint=hub.url, cache_dir=cache), planning=Planning())


def test_pull_fills_the_hugging_face_cache_with_progress(hub: LoopbackHub, tiny_model: Path, tmp_path: Path) -> None:
    events: list[PullEvent] = []
    path = _pull(hub, tmp_path / "cache", "test/tiny", events)
    assert path == tmp_path / "cache" / "models--test--tiny" / "snapshots" / hub.repos["test/tiny"].commit
    for source in tiny_model.iterdir():
        assert (path / source.name).read_bytes() == source.read_bytes()
    assert (path.parent.parent / "refs" / "main").read_text() == hub.repos["test/tiny"].commit
    listed = next(event for event in events if isinstance(event, Listed))
    assert listed.manifest.total_bytes == sum(source.stat().st_size for source in tiny_model.iterdir())
    fitted = next(event for event in events if isinstance(event, Fitted))
    assert fitted.verdict is not None and fitted.verdict.fits
    progress = [event for event in events if isinstance(event, Progress)]
    assert progress[-1].done_bytes == progress[-1].total_bytes == listed.manifest.total_bytes
    assert [event.done_bytes for event in progress] == sorted(event.done_bytes for event in progress)
    assert isinstance(events[-1], Pulled)
    # The cache is huggingface_hub's own: its offline lookup finds the model without the Hub.
    from huggingface_hub import snapshot_download

    assert Path(snapshot_download("test/tiny", cache_dir=tmp_path / "cache", local_files_only=True)) == path


def test_a_cut_connection_resumes_where_it_stopped(smollm2_model: Path, tmp_path: Path) -> None:
    """Cut past the first 10 MiB chunk, huggingface_hub asks for the rest with a Range and the file is whole."""
    served = LoopbackHub()
    served.add("test/smollm2", smollm2_model)
    served.cut_once.add("model.safetensors")
    with served.running() as hub:
        path = _pull(hub, tmp_path / "cache", "test/smollm2")
    gets = [served_ for served_ in hub.fetched() if served_.path.endswith("/model.safetensors")]
    assert [get.status for get in gets] == [200, 206]
    assert gets[1].range is not None and int(gets[1].range.removeprefix("bytes=").split("-")[0]) > 0
    assert (path / "model.safetensors").read_bytes() == (smollm2_model / "model.safetensors").read_bytes()


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"], ids=["lfs-sha256", "git-blob-id"])
def test_a_bad_checksum_fails_clearly_and_leaves_nothing(hub: LoopbackHub, tmp_path: Path, name: str) -> None:
    hub.corrupt.add(name)
    cache = tmp_path / "cache"
    with pytest.raises(PullError) as failed:
        _pull(hub, cache, "test/tiny")
    assert failed.value.kind == "checksum"
    assert name in str(failed.value) and "digest" in str(failed.value)
    assert not (cache / "models--test--tiny").exists()
    assert cached_models(Planning(), Hub(cache_dir=cache)) == []


def test_a_failed_pull_keeps_what_was_there(hub: LoopbackHub, tiny_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _pull(hub, cache, "test/tiny")
    before = sorted(str(path.relative_to(cache)) for path in cache.rglob("*") if ".locks" not in path.parts)
    # A new revision adds a weight file, which arrives corrupt: the revision already pulled is untouched.
    newer = tmp_path / "newer"
    shutil.copytree(tiny_model, newer)
    (newer / "extra.safetensors").write_bytes(bytes(range(256)) * 64)
    commit = hub.add("test/tiny", newer)
    hub.corrupt.add("extra.safetensors")
    with pytest.raises(PullError, match=r"extra\.safetensors"):
        _pull(hub, cache, "test/tiny")
    after = sorted(str(path.relative_to(cache)) for path in cache.rglob("*") if ".locks" not in path.parts)
    assert after == before
    assert commit not in (cache / "models--test--tiny" / "refs" / "main").read_text()


@pytest.mark.parametrize("reference", ["test/absent", "test/tiny:no-such-branch"])
def test_an_unknown_repository_or_revision_is_a_clear_error(hub: LoopbackHub, tmp_path: Path, reference: str) -> None:
    with pytest.raises(PullError) as failed:
        _pull(hub, tmp_path / "cache", reference)
    assert failed.value.kind == "not_found"
    assert reference.split(":")[-1].removeprefix("test/") in str(failed.value)
    assert not list(served_files(hub))
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("models--*"))


def test_a_model_that_does_not_fit_is_refused_before_its_weights(hub: LoopbackHub, tmp_path: Path) -> None:
    events: list[PullEvent] = []
    with pytest.raises(PullError) as failed:
        _pull(hub, tmp_path / "cache", "test/huge", events)
    assert failed.value.kind == "too_big"
    assert "does not fit" in str(failed.value)
    # config.json alone was read, into a scratch folder: no weight byte, nothing in the cache.
    assert list(served_files(hub)) == ["config.json"]
    assert not (tmp_path / "cache").exists()


def test_models_lists_and_rm_removes(hub: LoopbackHub, tiny_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _pull(hub, cache, "test/tiny")
    (listed,) = cached_models(Planning(), Hub(cache_dir=cache))
    assert listed.repo == "test/tiny"
    assert listed.size_bytes == sum(source.stat().st_size for source in tiny_model.iterdir())
    assert listed.here is not None and listed.here.fits and len(listed.matrix) == 12
    remove_model("test/tiny", Hub(cache_dir=cache))
    assert cached_models(Planning(), Hub(cache_dir=cache)) == []
    with pytest.raises(PullError, match="not in the Hugging Face cache"):
        remove_model("test/tiny", Hub(cache_dir=cache))
