"""stages/cache/disk.py with LoRA adapters: an adapter's KV on disk serves that adapter only.

An entry is filed under its adapter's space (the adapter's name and its
weights' fingerprint). The base model, another adapter, the same name with
other weights, and a file moved into another space's folder never get it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.cache.disk import DiskTier, SpillJob
from stages.cache.kv_file import adapter_fingerprint
from stages.cache.link import DiskLink
from stages.cache.tier import Entry
from stages.models.mlx_internals import restore_layer
from tests.stages.cache.test_prompt_cache import kv
from tests.stages.cache.test_prompt_cache_disk import FINGERPRINT, TOKENS

ADAPTERS = {"a": "1" * 64, "b": "2" * 64}


def tier(root: Path, adapters: dict[str, str] = ADAPTERS) -> DiskTier:
    disk = DiskTier(root=root, max_bytes=1 << 24, fingerprint=FINGERPRINT, adapters=adapters)
    disk.scan()
    return disk


def spill(disk: DiskTier, adapter: str | None, first: int = 0) -> list[SpillJob]:
    cache = kv(len(TOKENS), first=first)
    outbox: list[SpillJob] = []
    DiskLink(disk, outbox, restore_layer).spill(
        Entry(tokens=TOKENS, cache=cache, prompt_len=len(TOKENS), adapter=adapter)
    )
    for job in outbox:
        disk.write(job)
    return outbox


def restore(disk: DiskTier, adapter: str | None) -> Entry | None:
    link = DiskLink(disk, [], restore_layer)
    found = link.longest(TOKENS + (1,), adapter)
    return link.restore(found[0], adapter) if found is not None else None


def first_key(entry: Entry) -> float:
    return float(entry.cache[0].keys[0, 0, 0, 0].item())


def test_each_adapter_gets_its_own_entry_back_and_the_base_model_its_own(tmp_path: Path) -> None:
    """The same tokens under the base model and two adapters are three files; each restores to its own."""
    disk = tier(tmp_path)
    firsts = {None: 0, "a": 1000, "b": 2000}
    for adapter, first in firsts.items():
        spill(disk, adapter, first)
    assert disk.statistics().entries == 3
    for adapter, first in firsts.items():
        restored = restore(disk, adapter)
        # kv() puts `first + position` in every key: each entry is told apart by its first key.
        assert restored is not None and restored.adapter == adapter and first_key(restored) == first


def test_an_adapter_entry_never_serves_the_base_model_or_another_adapter(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    spill(disk, "a")
    assert restore(disk, None) is None and restore(disk, "b") is None
    assert restore(disk, "a") is not None
    # A restart indexes the adapter's folder and keeps the separation.
    again = tier(tmp_path)
    assert again.statistics().entries == 1
    assert restore(again, None) is None and restore(again, "b") is None and restore(again, "a") is not None


def test_the_same_name_with_other_weights_does_not_match(tmp_path: Path) -> None:
    spill(tier(tmp_path), "a")
    retrained = tier(tmp_path, {"a": "3" * 64})
    assert restore(retrained, "a") is None
    assert restore(tier(tmp_path), "a") is not None


def test_an_adapter_not_listed_is_not_spilled(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    assert spill(disk, "unlisted") == [] and disk.statistics().entries == 0


@pytest.mark.parametrize("into", ["base folder", "other adapter's folder"])
def test_a_file_moved_into_another_space_is_discarded_at_start(tmp_path: Path, into: str) -> None:
    disk = tier(tmp_path)
    spill(disk, "a")
    (path,) = tmp_path.glob("adapters/*/*.safetensors")
    if into == "base folder":
        target = tmp_path / path.name
    else:
        spill(disk, "b")
        (other,) = [p for p in tmp_path.glob("adapters/*/*.safetensors") if p.parent != path.parent]
        target = other.parent / "moved.safetensors"
    path.rename(target)
    again = tier(tmp_path)
    assert again.statistics().corrupt == 1 and not target.exists()
    assert restore(again, None) is None and restore(again, "a") is None


def test_an_adapter_fingerprint_covers_all_of_its_weights(tmp_path: Path) -> None:
    """Two adapters that differ in one byte in the middle of their weights have different fingerprints."""
    config = tmp_path / "adapter_config.json"
    config.write_text("{}")
    weights = tmp_path / "adapters.safetensors"
    data = bytearray(3 << 20)
    weights.write_bytes(bytes(data))
    before = adapter_fingerprint(config, weights)
    data[len(data) // 2] = 1
    weights.write_bytes(bytes(data))
    assert adapter_fingerprint(config, weights) != before
